"""Peer: transformers `generate` on the same checkpoint (hf-ar), and with the draft as assistant (hf-assisted).

A GGUF source is loaded through transformers' own GGUF reader (`gguf_file=`), an HF directory
directly; both in the bench's working dtype. Prompts go in as our token ids, so tokenization is shared.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from swiftspec.bench.harness import RunResult

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def load_hf_model(path: Path, dtype: str) -> torch.nn.Module:
    """transformers' causal LM for a .gguf file or an HF directory, in eval mode."""
    from transformers import AutoModelForCausalLM

    if path.is_dir():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    else:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=_DTYPES[dtype])
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes read per forward: every parameter except the input embedding (the LM head is counted,
    also when it is tied to the embedding)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen = {embed.data_ptr()} - {head.data_ptr()}
    total = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


class _TimingStreamer:
    """A transformers streamer that records when each chunk of new tokens arrives and its size."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first_s = 0.0
        self.chunks: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        if not self.chunks:
            self.first_s = time.perf_counter() - self.start
        self.chunks.append(int(value.numel()))

    def end(self) -> None:
        """Called by generate() at the end; nothing to flush."""


class _CallCounter:
    """A forward hook that counts calls of a module (the assistant's forwards)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module: torch.nn.Module, inputs: tuple, output: object) -> None:
        self.calls += 1


class HFRunner:
    """transformers `generate` with KV cache; greedy at temperature 0, plain temperature sampling else."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_ids: frozenset[int],
        temperature: float,
        assistant: torch.nn.Module | None = None,
        top_p: float = 1.0,
    ) -> None:
        self.model = model
        self.top_p = top_p
        self.assistant = assistant
        self.eos_ids = eos_ids
        self.temperature = temperature
        self.draft_calls = _CallCounter()
        if assistant is not None:
            assistant.register_forward_hook(self.draft_calls)

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult:
        from transformers import GenerationConfig

        sample = self.temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=self.temperature if sample else None,
            top_k=None,
            top_p=self.top_p if sample and self.top_p < 1 else None,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=min(self.eos_ids),
            use_cache=True,
        )
        ids = torch.tensor([prompt], dtype=torch.long)
        torch.manual_seed(seed)
        self.draft_calls.calls = 0
        streamer = _TimingStreamer()
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                assistant_model=self.assistant,
                streamer=streamer,
            )
        total = time.perf_counter() - streamer.start
        tokens = _clip_at_eos(out[0, len(prompt):].tolist(), self.eos_ids)
        return RunResult(
            tokens=tokens,
            ttft_s=streamer.first_s,
            total_s=total,
            first_tokens=min(streamer.chunks[0], len(tokens)) if streamer.chunks else 0,
            rounds=len(streamer.chunks),  # one chunk per target forward (the prefill's included)
            round_tokens=len(tokens),  # the chunks' sum, less a final EOS
            draft_forwards=self.draft_calls.calls if self.assistant is not None else None,
        )

    def close(self) -> None:
        self.model = self.assistant = None


def _clip_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i]
    return tokens
