"""Build the pruned draft head's token-frequency table from a real code corpus.

Tokenizes every .py file of this Python's standard library with the default pair's tokenizer and
writes swiftspec/data/<name>.json: the ids seen, by descending frequency (ties: lower id first),
plus a fingerprint of the tokenizer so a mismatched model is detected.

    .venv/bin/python tools/make_vocab_table.py [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sysconfig

from swiftspec.config import LoadConfig
from swiftspec.draft.vocab import TABLE_DIR, fingerprint
from swiftspec.weights import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--name", default="qwen2.5-code")
    args = parser.parse_args()
    tok = load_model(args.model, LoadConfig(dtype="bfloat16", max_seq_len=64)).tokenizer
    counts: collections.Counter[int] = collections.Counter()
    files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    for path in files:
        try:
            counts.update(tok.encode(path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    seen = sorted(counts, key=lambda t: (-counts[t], t))
    out = TABLE_DIR / f"{args.name}.json"
    out.write_text(json.dumps({"fingerprint": fingerprint(tok), "corpus": f"python stdlib, {len(files)} files",
                               "tokens": sum(counts.values()), "order": seen}, separators=(",", ":")))
    print(f"wrote {out}: {len(seen)} distinct of {tok.vocab_size} ids from {sum(counts.values())} tokens")


if __name__ == "__main__":
    main()
