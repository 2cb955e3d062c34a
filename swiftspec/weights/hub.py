"""Models named by Hugging Face hub id: `org/name` (a safetensors repository) or `org/name:file.gguf`
(one GGUF file of a repository), resolved through huggingface_hub and its cache.

The hub cache ($HF_HUB_CACHE, else huggingface_hub's default) is used as is, and HF_HUB_OFFLINE=1
(read when a model is resolved) makes resolution use the cache alone.  A model that is neither in
the cache nor reachable is a one-line UserError.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from swiftspec.errors import UserError

# org/name, optionally :file.gguf; hub names use letters, digits, '-', '_' and '.'.
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<file>[^:]+\.gguf))?$")
# What a safetensors model needs: config, weights (or shards and their index) and the tokenizer.
SAFETENSORS_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True, slots=True)
class HubId:
    """A parsed hub model name."""

    repo: str  # org/name
    file: str | None  # a GGUF inside the repository, or None for the safetensors checkpoint


def parse_hub_id(source: str) -> HubId | None:
    """The hub id that source spells, or None when it cannot be one."""
    m = _HUB_ID.match(source)
    if m is None or source.startswith((".", "/", "~")):
        return None
    return HubId(m["repo"], m["file"])


def offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub itself reads it once, at import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE")
    return env.upper() in _TRUE if env is not None else bool(constants.HF_HUB_OFFLINE)


def hub_cache() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def resolve_hub(hub: HubId) -> Path:
    """The local GGUF file or snapshot directory of `hub`, downloading it unless offline."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    name = hub.repo + (f":{hub.file}" if hub.file else "")
    local_only = offline()
    try:
        if hub.file:
            return Path(hf_hub_download(hub.repo, hub.file, cache_dir=hub_cache(), local_files_only=local_only))
        return Path(snapshot_download(hub.repo, cache_dir=hub_cache(), allow_patterns=SAFETENSORS_FILES,
                                      local_files_only=local_only))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if local_only else "the hub cannot be reached"
        raise UserError(f"model {name} is not in the hub cache ({hub_cache()}) and {why}") from None
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        what = "no such model (or no access)" if status in (401, 403, 404) else str(e).splitlines()[0]
        raise UserError(f"cannot get model {name} from the hub: {what}") from None
    except (OSError, ValueError) as e:  # no network, a bad repo name, a full disk
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot get model {name} from the hub: {first}") from None
