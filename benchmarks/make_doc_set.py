"""Build `bench --dataset longdoc`: a question about a long document, asked through the chat template.

The documents are the long descriptions (READMEs) in the package metadata of eight permissively licensed
packages, as `make install` installs them (each record's "source" names the package, its version and
licence), kept whole up to MAX_TOKENS; each comes with a question written for this project that the
document answers:

    .venv/bin/python benchmarks/make_doc_set.py
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib

from swiftspec.weights.loader import load_tokenizer

# (distribution, licence, question)
from swiftspec.weights.source import resolve_source

SOURCES = (
    ("sortedcontainers", "Apache-2.0", "Which data types does this package provide, and what does the document "
                                       "say about its speed compared with the alternatives?"),
    ("huggingface_hub", "Apache-2.0", "How do I download a single file from the Hub with this library? Show the code "
                                      "and say where the file ends up."),
    ("sympy", "BSD-3-Clause", "How do I install SymPy, run its tests, and where should I report a bug?"),
    ("annotated-types", "MIT", "Explain Gt, Ge, Lt, Le and Interval as the document describes them, with one example "
                               "each."),
    ("typer", "MIT", "Following the document, write a Typer program with two commands and show how to run each one."),
    ("rich", "MIT", "According to the document, how do I print a table with Rich? Give a short example."),
    ("psutil", "BSD-3-Clause", "Using the document, show how to list the running processes with their memory use."),
    ("diskcache", "Apache-2.0", "Summarize what problem DiskCache solves and how the document compares it with "
                                "other caches."),
)
MAX_TOKENS = 4500  # of the document (Qwen2.5 tokenizer); longer ones are cut at a paragraph
DATA = pathlib.Path(__file__).resolve().parent.parent / "swiftspec" / "data"


def _document(dist: str, tokenizer) -> str:
    """The distribution's long description, cut at the last paragraph end within MAX_TOKENS."""
    text = importlib.metadata.metadata(dist).get_payload().strip()
    if len(tokenizer.encode(text)) <= MAX_TOKENS:
        return text
    paragraphs, kept = text.split("\n\n"), []
    for p in paragraphs:
        if len(tokenizer.encode("\n\n".join(kept + [p]))) > MAX_TOKENS:
            break
        kept.append(p)
    return "\n\n".join(kept)


def build() -> None:
    tokenizer = load_tokenizer(resolve_source("qwen2.5-coder-1.5b-instruct"))
    records = []
    for dist, licence, question in SOURCES:
        doc = _document(dist, tokenizer)
        prompt = f"Read this document, then answer the question after it.\n\n<document>\n{doc}\n</document>\n\n{question}"
        source = f"{dist} {importlib.metadata.version(dist)} ({licence}): package metadata description"
        records.append({"id": f"longdoc/{dist}", "source": source, "prompt": prompt})
        print(f"{dist}: {len(tokenizer.encode(prompt))} tokens")
    (DATA / "longdoc8.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    build()
