"""The exceptions that reach users: bad input (UserError), a failed engine worker (EngineFault),
and the communication failure (LinkError) that a worker fault shows up as on the other ranks."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator


class UserError(Exception):
    """Bad input from the user: a path, a file, a flag or a request. Its message is one line."""


class EngineFault(Exception):
    """A worker process died, hung or lost contact: the running request failed, and the engine
    must recover() before it serves again (CLI: exit code 3; HTTP: 503). Its message is one line."""


class LinkError(RuntimeError):
    """A message to or from another rank failed: the peer died, closed its connection or timed out."""


@contextmanager
def link_errors() -> Iterator[None]:
    """Around torch.distributed calls: their RuntimeErrors become LinkErrors (one line, no source path),
    so that only communication failures are ever reported as lost contact."""
    try:
        yield
    except LinkError:
        raise
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LinkError(re.sub(r"^\[[^\]]*\]\s*", "", first)) from exc
