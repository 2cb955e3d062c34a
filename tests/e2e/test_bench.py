"""`swiftspec bench` end to end on the tiny model: the report's schema and files (values not asserted)."""

from __future__ import annotations

import json

import pytest

from swiftspec.bench.check import problems
from swiftspec.bench.divergence import TieProbe, compare_to_ar, first_mismatch
from swiftspec.bench.harness import RunResult, check_groups, parse_modes, run_interleaved
from swiftspec.bench.prompts import WARMUP_PROMPT, Prompt, load_prompts, split_warmup
from swiftspec.bench.roofline import WeightBytes, bound
from swiftspec.cli.main import run as cli_run
from swiftspec.config import LoadConfig
from swiftspec.errors import UserError

DIST_KEYS = {"mean", "median", "p10", "p90"}
MODE_KEYS = {
    "kind", "backend", "tokens_per_s", "e2e_tokens_per_s", "ttft_s", "tpot_s", "acceptance_length", "rounds",
    "draft_s", "verify_s", "matches_ar", "first_divergence", "divergences", "speedup_vs_ar", "speedup_vs_hf_ar", "speedup_vs_peer", "roofline",
    "per_prompt",
}
ROOFLINE_KEYS = {"target_weight_bytes", "draft_weight_bytes", "draft_forwards_per_round", "bytes_per_token",
                 "bound_tokens_per_s", "fraction_of_bound"}


def test_bench_tiny_report(tmp_path, tmp_cache, tiny_qwen_dir, tiny_draft_dir) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"prompt": "def add(a, b):\\n    return"}\n{"prompt": "The quick brown fox"}\n')
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 120)
    out = tmp_path / "out"
    rc = cli_run([
        "bench", "--model", str(tiny_qwen_dir), "--draft-model", str(tiny_draft_dir), "--dtype", "float32",
        "--max-seq-len", "256", "--modes", "ar,chain,auto;hf-ar,llamacpp-ar,ikllama-ar", "--prompts", "2", "--dataset",
        str(dataset), "--max-tokens", "8", "--warmup", "1", "--threads", "1", "--out", str(out),
        "--trace-dir", str(tmp_path / "traces"), "--chat", "--perplexity", str(text), "--perplexity-windows", "1",
    ])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert {"cpu", "cores", "threads", "torch", "git_commit", "date", "command"} <= set(report["machine"])
    assert report["bandwidth_gb_s"] > 0 and report["settings"]["chat_template"] is True
    assert set(report["modes"]) == {"ar", "chain", "auto", "hf-ar"}
    auto = report["auto"]["auto"]  # auto's choice, measured as the mode `auto`, beside the fastest measured
    assert auto["choice"] in ("ar", "chain", "tree", "async") and auto["measured_choice"] == "auto"
    assert auto["measured_best"] in ("ar", "chain", "auto") and 0 < auto["choice_of_best"] <= 1
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert traces == [f"{m}-prompt{i}.json" for m in ("ar", "auto", "chain") for i in (0, 1)]
    assert {"llamacpp-ar", "ikllama-ar"} <= set(report["skipped"])  # both need a GGUF; the tiny model is an HF directory
    assert all(m["speedup_vs_peer"] is None for m in report["modes"].values())  # no peer ran
    for name, mode in report["modes"].items():
        assert MODE_KEYS <= set(mode), name
        assert set(mode["tokens_per_s"]) == DIST_KEYS
        assert ROOFLINE_KEYS <= set(mode["roofline"])
        assert len(mode["per_prompt"]) == 2 and all(isinstance(p["tokens"], list) for p in mode["per_prompt"])
        assert isinstance(mode["matches_ar"], bool)
        if not mode["matches_ar"]:
            assert {"prompt", "token_index", "tie"} <= set(mode["first_divergence"])
    assert report["modes"]["ar"]["matches_ar"] is True
    assert report["modes"]["ar"]["acceptance_length"] == 1.0
    assert report["modes"]["chain"]["backend"].endswith("; bf16 draft)")  # the draft's format, beside the target's
    assert "draft" not in report["modes"]["ar"]["backend"]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "report.md").read_text()
    assert all(f"| `{name}` |" in table for name in report["modes"])
    assert "Auto choice:" in table and "% of the fastest measured mode" in table
    assert set(report["perplexity"]) == {"file", "bf16"}  # the reference and the one format our modes ran
    ppl = report["perplexity"]["bf16"]["ppl"]
    ar_row = next(line for line in table.splitlines() if line.startswith("| `ar` |"))
    assert f"| {ppl:.3f} |" in ar_row and "Perplexity on" in table  # beside tok/s, and its own table
    # two groups (`;`): loaded one after the other; bench-check's validator: schema complete, and our chain mode is lossless against ar (up to ties).
    assert problems(out) == []


def test_parse_modes() -> None:
    specs = parse_modes("ar, tree@int4;hf-assisted,llamacpp-spec,ikllama-ar")
    assert [(s.kind, s.variant, s.weights, s.group) for s in specs] == [
        ("ours", "ar", None, 0), ("ours", "tree", "int4", 0), ("hf", "assisted", None, 1), ("llamacpp", "spec", None, 1),
        ("ikllama", "ar", None, 1)]
    for bad in ("warp", "tree@int3", "hf-ar@int4", "ar,ar", ""):
        with pytest.raises(UserError):
            parse_modes(bad)
    check_groups(parse_modes("async,tree;async@int4"))
    with pytest.raises(UserError, match="async engines in one group"):
        check_groups(parse_modes("async,tree,async@int4"))


def test_first_mismatch() -> None:
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2  # one run stopped (EOS) where the other went on


def test_divergence_probe(tiny_qwen_dir) -> None:
    probe = TieProbe(str(tiny_qwen_dir), LoadConfig(dtype="float32", max_seq_len=64))
    prompts = [[5, 6, 7], [8, 9]]
    divs = compare_to_ar([[1, 2, 3], [4, 4]], [[1, 9, 3], [4, 4]], prompts, probe)
    probe.close()
    assert len(divs) == 1
    d = divs[0]
    assert (d.prompt, d.token_index, d.ar_token, d.mode_token) == (0, 1, 2, 9)
    assert isinstance(d.tie, bool) and d.logit_gap >= 0 and d.tolerance > 0


def test_roofline_bound() -> None:
    ar = bound(WeightBytes(target=1000), bandwidth=1e6, acceptance_length=1.0)
    assert ar.tokens_per_s == pytest.approx(1000.0)
    spec = bound(WeightBytes(target=1000, draft=100), bandwidth=1e6, acceptance_length=3.0, draft_forwards_per_round=4)
    assert spec.bytes_per_token == pytest.approx(1400 / 3)


def test_humaneval_prompts() -> None:
    prompts = load_prompts(2)
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].text.startswith("from typing import List")


def test_warmup_runs_never_a_timed_prompt() -> None:
    """Warm-up runs take the data set's prompts after the timed ones, cycling, or WARMUP_PROMPT where
    it has none: a timed prompt warmed up first would find its prefix cached and, under prompt
    lookup, the warm-up's answer in the earlier text."""
    prompts = load_prompts(5)
    timed, warm = split_warmup(prompts, 3, 3)
    assert timed == prompts[:3] and warm == [prompts[3], prompts[4], prompts[3]]
    assert split_warmup(prompts, 5, 2) == (prompts, [WARMUP_PROMPT, WARMUP_PROMPT])
    assert split_warmup(prompts, 4, 0) == (prompts[:4], [])

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[list[int], int]] = []

        def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult:
            self.calls.append((prompt, max_new_tokens))
            return RunResult(tokens=[1], ttft_s=0.1, total_s=0.2)

        def close(self) -> None:
            pass

    runners = {"a": Recorder(), "b": Recorder()}
    results = run_interleaved(runners, [[1], [2]], 64, 0, [[9]], label="test")
    for r in runners.values():  # the warm-up first (at most 32 tokens), then each timed prompt once
        assert r.calls == [([9], 32), ([1], 64), ([2], 64)]
    assert [len(v) for v in results.values()] == [2, 2]


def test_bundled_chat_set() -> None:
    """40 chat questions ship with the package; the first eight span several kinds and languages."""
    prompts = load_prompts(40, "chat")
    assert len(prompts) == 40 and len({p.text for p in prompts}) == 40
    assert prompts[0].id == "chat/0"
    assert any(ord(c) > 0x3000 for p in prompts[:8] for c in p.text)  # a CJK question among the first eight


def test_chat_flag_applies_the_chat_template(tiny_qwen_dir) -> None:
    from swiftspec.bench.command import _encode
    from swiftspec.config import EngineConfig, LoadConfig
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tiny_qwen_dir)
    plain, chat = (_encode(tok, Prompt("0", "Hello"), flag) for flag in (False, True))
    assert plain == tok.encode("Hello") and chat == tok.chat([{"role": "user", "content": "Hello"}])
    assert len(chat) > len(plain)


def test_long_code_and_fim_sets(tiny_fim_dir, tiny_qwen_dir) -> None:
    """The long-context sets ship with the package: 8 long completions, and 8 FIM cuts that bench
    renders with the model's FIM tokens (a model without them is a one-line error)."""
    from swiftspec.bench.command import _context, _encode
    from swiftspec.config import EngineConfig
    from swiftspec.fim import find_fim_tokens
    from swiftspec.tokenizer import Tokenizer

    longcode, fim = load_prompts(8, "longcode"), load_prompts(8, "fim")
    assert len(longcode) == len(fim) == 8 and all(len(p.text) > 7000 for p in longcode)
    assert all(p.suffix is None for p in longcode) and all(p.suffix for p in fim)
    docs = load_prompts(8, "longdoc")  # a question after each document
    assert len(docs) == 8 and all(len(p.text) > 7000 and "</document>" in p.text for p in docs)
    assert all(p.text.rstrip().endswith("?") or p.text.rstrip().endswith(".") for p in docs)
    tok = Tokenizer.from_dir(tiny_fim_dir)
    ids = _encode(tok, fim[0], False)
    tokens = find_fim_tokens(tok)
    assert ids.count(tokens.prefix) == ids.count(tokens.suffix) == ids.count(tokens.middle) == 1
    assert ids[-1] == tokens.middle
    with pytest.raises(UserError, match="FIM tokens"):
        _encode(Tokenizer.from_dir(tiny_qwen_dir), fim[0], False)
    sized = _context(EngineConfig(), [ids, [1, 2]], 128)  # no --max-seq-len: what the prompts need
    assert sized.target_load.max_seq_len == sized.draft_load.max_seq_len >= len(ids) + 128
    with pytest.raises(UserError, match="exceeds --max-seq-len 64"):
        _context(EngineConfig(target_load=LoadConfig(max_seq_len=64)), [ids], 128)


def test_speedup_against_the_faster_peer() -> None:
    """`vs best peer` divides by the faster of llama.cpp's and ik_llama.cpp's plain decoding in the run."""
    from swiftspec.bench.summary import add_speedups, best_peer

    modes = {name: {"tokens_per_s": {"mean": speed}} for name, speed in
             (("ar", 20.0), ("tree", 40.0), ("llamacpp-ar", 16.0), ("ikllama-ar", 25.0))}
    add_speedups(modes)
    assert best_peer(modes) == "ikllama-ar"
    assert modes["tree"]["speedup_vs_peer"] == 40.0 / 25.0 and modes["ar"]["speedup_vs_peer"] == 20.0 / 25.0
    del modes["ikllama-ar"]
    add_speedups(modes)
    assert best_peer(modes) == "llamacpp-ar" and modes["tree"]["speedup_vs_peer"] == 40.0 / 16.0
