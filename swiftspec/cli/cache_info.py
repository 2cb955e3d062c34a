"""`swiftspec info`'s prompt cache line: the default size on this machine, or what a running server's
cache holds and how often it served (read from its /metrics)."""

from __future__ import annotations

import os
import re

from swiftspec.errors import UserError
from swiftspec.runner.load import PROMPT_CACHE_MAX_MB, PROMPT_CACHE_SHARE, free_memory


def prompt_cache_line(url: str | None) -> str:
    """One line: the default --prompt-cache-mb here (url None), else the server's cache."""
    if url is None:
        mb = min(PROMPT_CACHE_MAX_MB, int(PROMPT_CACHE_SHARE * free_memory("cpu")) >> 20)
        return (f"prompt cache: {mb} MiB of earlier texts' KV by default here (--prompt-cache-mb -1: "
                f"{PROMPT_CACHE_SHARE:g} of the free memory, at most {PROMPT_CACHE_MAX_MB})")
    import httpx

    key = os.environ.get("SWIFTSPEC_API_KEY", "")
    try:
        r = httpx.get(url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {},
                      timeout=10)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"cannot read {url}/metrics: {exc}") from None
    value = _reader(r.text)
    prompt, cached = value('swiftspec_tokens_total{kind="prompt"}'), value('swiftspec_tokens_total{kind="cached"}')
    hits, lookups = value("swiftspec_prompt_cache_hits"), value("swiftspec_prompt_cache_lookups")
    share = f"{cached / prompt:.0%}" if prompt else "-"
    return (f"prompt cache of {url}: {value('swiftspec_prompt_cache_bytes') / 2**20:.0f} MiB in "
            f"{value('swiftspec_prompt_cache_entries'):.0f} texts; {cached:.0f} of {prompt:.0f} prompt tokens "
            f"reused ({share}); store hits {hits:.0f} of {lookups:.0f} lookups")


def _reader(text: str):  # noqa: ANN202 - name -> float
    values = dict(re.findall(r"^(\S+) ([-+0-9.eE]+)$", text, re.M))
    return lambda name: float(values.get(name, 0.0))
