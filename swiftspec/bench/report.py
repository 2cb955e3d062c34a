"""The bench's outputs: report.json (everything), report.md (tables) and the machine description."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from swiftspec.bench import auto_report
from swiftspec.bench.perplexity import Perplexity
from swiftspec.bench.perplexity import markdown as ppl_markdown
from swiftspec.bench.summary import DEFINITIONS, best_peer
from swiftspec.kernels.capability import capability, cpu_model


def machine_info(threads: int) -> dict:
    """CPU model, cores, threads, library versions, git commit, date and the command line."""
    import transformers

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "kernels": capability().to_json(),  # ISA level in use and each CPU kernel's path
        "git_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }


def _git_commit() -> str | None:
    """HEAD of the checkout this package runs from, with `-dirty` when the tree has changes."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _ppl(report: dict, m: dict) -> float | None:
    """The perplexity of what a mode ran: its weight format, or llama.cpp's on the file."""
    table = report.get("perplexity") or {}
    label = "llama.cpp" if m["kind"] == "llamacpp" else m.get("weights")
    return table.get(label, {}).get("ppl")


def _row(name: str, m: dict, ppl: float | None) -> str:
    tps = m["tokens_per_s"]
    roof = m["roofline"]
    matches = {True: "yes", False: "no", None: "—"}[m["matches_ar"]]
    if m["divergences"] and all(d["tie"] for d in m["divergences"]):
        matches += " (ties)"
    cells = [
        f"`{name}`", _fmt(tps["mean"], ".1f"), _fmt(tps["median"], ".1f"),
        f"{tps['p10']:.1f}–{tps['p90']:.1f}", _fmt(m["ttft_s"], ".3f"), _fmt(m["tpot_s"] * 1e3, ".1f"),
        _fmt(m["acceptance_length"]), matches, _fmt(ppl, ".3f"), _fmt(m["speedup_vs_hf_ar"], suffix="×"),
        _fmt(m["speedup_vs_ar"], suffix="×"), _fmt(m.get("speedup_vs_peer"), suffix="×"),
        _fmt(roof["bound_tokens_per_s"], ".1f"),
        _fmt(None if roof["fraction_of_bound"] is None else 100 * roof["fraction_of_bound"], ".0f", "%"),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(report: dict) -> str:
    """A human summary of report.json: settings, the speed table, notes and definitions."""
    mach, s = report["machine"], report["settings"]
    lines = [
        "# SwiftSpec benchmark",
        "",
        f"{mach['cpu']}, {mach['cores']} cores, {mach['threads']} threads; torch {mach['torch']}, "
        f"transformers {mach['transformers']}; commit `{mach['git_commit']}`; {mach['date']}.",
        f"{s['prompts']} prompts from {s['dataset']}{' (chat template)' if s.get('chat_template') else ''}, "
        f"{s['max_tokens']} new tokens, temperature "
        f"{s['temperature']}{', top-p ' + str(s['top_p']) if s.get('top_p', 1.0) < 1 else ''}, seed {s['seed']}, {s['warmup']} warm-up runs per mode; measured read bandwidth "
        f"{report['bandwidth_gb_s']:.1f} GB/s.",
        "",
        "| mode | tok/s mean | median | p10–p90 | TTFT s | TPOT ms | accept len | = ar | perplexity | vs hf-ar "
        "| vs ar | vs best peer | roofline tok/s | of roofline |",
        "|" + "---|" * 14,
    ]
    lines += [_row(name, m, _ppl(report, m)) for name, m in report["modes"].items()]
    if any(m.get("speedup_vs_peer") for m in report["modes"].values()):
        lines += ["", f"vs best peer: against `{best_peer(report['modes'])}`, the faster of llamacpp-ar and "
                      "ikllama-ar in this run."]
    if report.get("perplexity"):
        rows = [Perplexity(**r) for r in report["perplexity"].values()]
        lines += [""] + ppl_markdown(rows, s["perplexity_text"])
    lines += ["", "Backends:"] + [f"- `{n}`: {m['backend']}" for n, m in report["modes"].items()]
    divergent = {n: m["divergences"] for n, m in report["modes"].items() if m["divergences"]}
    if divergent:
        lines += ["", "Divergences from `ar` (first differing token per prompt):"]
        lines += [f"- `{n}`: prompt {d['prompt']}, token {d['token_index']} (ar {d['ar_token']}, "
                  f"mode {d['mode_token']}), tie: {d['tie']}, gap {_fmt(d['logit_gap'], '.4g')} "
                  f"vs tolerance {_fmt(d['tolerance'], '.4g')}" for n, ds in divergent.items() for d in ds]
    lines += auto_report.markdown_lines(report.get("auto", {}))
    if report["skipped"]:
        lines += ["", "Skipped:"] + [f"- `{n}`: {why}" for n, why in report["skipped"].items()]
    lines += ["", "Definitions:"] + [f"- {k}: {v}" for k, v in DEFINITIONS.items()]
    return "\n".join(lines) + "\n"


def write_markdown(report: dict, path: Path) -> None:
    path.write_text(markdown(report))


def print_roofline(report: dict) -> None:
    """One line per mode on stderr: achieved tok/s against its bandwidth bound."""
    print(f"roofline: read bandwidth {report['bandwidth_gb_s']:.1f} GB/s", file=sys.stderr)
    for name, m in report["modes"].items():
        roof = m["roofline"]
        frac = roof["fraction_of_bound"]
        print(f"  {name:>16}: {m['tokens_per_s']['mean']:7.1f} tok/s of {roof['bound_tokens_per_s']:7.1f} bound "
              f"({_fmt(None if frac is None else 100 * frac, '.0f', '%')}), "
              f"{roof['bytes_per_token'] / 1e6:.0f} MB/token", file=sys.stderr)
