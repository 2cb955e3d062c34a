"""The pruned draft LM head: the draft scores only the N most frequent tokens of a code corpus.

Tables live in swiftspec/data/<family>-<corpus>.json (made by tools/make_vocab_table.py) and carry
a fingerprint of the tokenizer they were built with; a draft whose tokenizer matches none keeps its
full head.  The pruned head serves a request only while its text stays inside the table (at most
TEXT_SLACK of its tokens outside; the drafter switches to the full head otherwise), so the head
fits the request: code keeps the smaller head, chat and other languages draft with the full one.  Verification stays lossless: the
draft's q is renormalized over the subset (zero outside it), and the target decides every token.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

TABLE_DIR = Path(__file__).resolve().parent.parent / "data"
_PROBE = "def main(argv):\n    return sorted(set(argv), key=len)  # ünïcode\n"
log = logging.getLogger("swiftspec")
# A request's text (its prompt, then every verified token) may have this share of tokens outside the
# table and keep the pruned head, which then also scores those tokens (the drafter's extension); the
# full head costs every expansion ~2.5 ms more (docs/bench/chat-drafting.md).
TEXT_SLACK = 0.05
MAX_EXTRA_ROWS = 256  # most ids outside the table one request adds to its pruned head


def fingerprint(tokenizer) -> str:  # tokenizer: swiftspec.tokenizer.Tokenizer
    """Identifies a tokenizer by its size and how it splits a probe string."""
    probe = json.dumps([tokenizer.vocab_size, tokenizer.encode(_PROBE)])
    return hashlib.sha256(probe.encode()).hexdigest()[:16]


def pruned_vocab(tokenizer, size: int, vocab_rows: int, corpus: str = "code") -> torch.Tensor | None:
    """Sorted token ids [size] the pruned head keeps (EOS ids always), or None for the full head.

    vocab_rows is the draft LM head's row count; ids beyond it are never kept.  corpus names the
    table (swiftspec/data/<family>-<corpus>.json).
    """
    if size <= 0 or size >= vocab_rows:
        return None
    mine = fingerprint(tokenizer)
    for path in sorted(TABLE_DIR.glob(f"*-{corpus}.json")):
        table = json.loads(path.read_text())
        if table["fingerprint"] == mine:
            seen = [t for t in table["order"] if t < vocab_rows]
            unseen = sorted(set(range(vocab_rows)) - set(seen))  # lower BPE ids merge earlier
            keep = (seen + unseen)[:size]
            ids = set(keep[: size - len(tokenizer.eos_token_ids)]) | set(tokenizer.eos_token_ids)
            return torch.tensor(sorted(ids), dtype=torch.long)
    log.warning("no draft vocabulary table matches this tokenizer; the draft keeps its full LM head")
    return None
