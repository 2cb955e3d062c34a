"""Build the long-context code sets of `bench --dataset`: `longcode` (completion of a real source file
from 2k-4k tokens of its own text) and `fim` (fill-in-the-middle: the text before and after a cut).

The files come from permissively licensed third-party packages (not the Python standard library, which
the pruned draft head's token table was counted on), as installed by `make install` in the versions
recorded in each record's "source" field:

    .venv/bin/python benchmarks/make_code_sets.py

Each prompt ends at the end of a line inside an indented block, so the model continues real code.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pathlib

from swiftspec.weights.loader import load_tokenizer

# (package, licence, file under the package's folder): one long-code and one FIM prompt each
from swiftspec.weights.source import resolve_source

SOURCES = (
    ("click", "BSD-3-Clause", "core.py"),
    ("jinja2", "BSD-3-Clause", "compiler.py"),
    ("networkx", "BSD-3-Clause", "algorithms/shortest_paths/weighted.py"),
    ("h11", "MIT", "_connection.py"),
    ("httpx", "BSD-3-Clause", "_models.py"),
    ("anyio", "MIT", "_core/_fileio.py"),
    ("starlette", "BSD-3-Clause", "routing.py"),
    ("fastapi", "MIT", "routing.py"),
)
MIN_TOKENS, MAX_TOKENS = 2150, 4000
SUFFIX_TOKENS = 600  # FIM: the text after the cut that the prompt keeps
DATA = pathlib.Path(__file__).resolve().parent.parent / "swiftspec" / "data"


def _cut(lines: list[str], token_counts: list[int], target: int) -> int:
    """The line index after which to cut: the first indented, non-blank line at or past `target` tokens
    whose next line is indented too (so the continuation is inside a block)."""
    total = 0
    for i, n in enumerate(token_counts):
        total += n
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if total >= target and lines[i].startswith("    ") and lines[i].strip() and nxt.startswith("    "):
            return i + 1
    raise SystemExit(f"no cut point past {target} tokens")


def build() -> None:
    tokenizer = load_tokenizer(resolve_source("qwen2.5-coder-1.5b-instruct"))
    longcode, fim = [], []
    for k, (package, licence, rel) in enumerate(SOURCES):
        root = pathlib.Path(importlib.import_module(package).__file__).parent
        text = (root / rel).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        counts = [len(tokenizer.encode(line)) for line in lines]
        source = f"{package} {importlib.metadata.version(package)} ({licence}): {package}/{rel}"
        target = MIN_TOKENS + (MAX_TOKENS - MIN_TOKENS - 400) * k // (len(SOURCES) - 1)
        cut = _cut(lines, counts, target)
        longcode.append({"id": f"longcode/{k}", "source": source, "prompt": "".join(lines[:cut])})
        fim_cut = _cut(lines, counts, MIN_TOKENS - 400)
        after = fim_cut + 1
        while after < len(lines) and lines[after].strip():
            after += 1  # the middle is the rest of the paragraph after the cut
        suffix_end, total = after, 0
        while suffix_end < len(lines) and total < SUFFIX_TOKENS:
            total += counts[suffix_end]
            suffix_end += 1
        fim.append({"id": f"fim/{k}", "source": source, "prompt": "".join(lines[:fim_cut]),
                    "suffix": "".join(lines[after:suffix_end])})
    for name, records in (("longcode8.jsonl", longcode), ("fim8.jsonl", fim)):
        with open(DATA / name, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    build()
