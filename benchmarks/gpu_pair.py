"""Random-weight model pairs for benchmarks/gpu_check.py, built from a seed on the device (no files), and
the serial engines (ar, chain, tree) that run them.

The default pair's shapes are hard-coded: the GPU machine has no model files.  They were read with
swiftspec.weights.loader.model_args from the cached GGUFs (~/.cache/swiftspec/models/qwen2.5-coder-
{1.5b,0.5b}-instruct.gguf), equal field by field on 2026-12-03.  With random weights every per-forward latency is real, and acceptance is not: a random draft
agrees with a random target about as often as chance, so tok/s is measured per round and the
acceptance lengths come from the CPU runs of the real pair (benchmarks/gpu_check.py, step 3).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from swiftspec import kernels
from swiftspec.config import TreeConfig
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.build import chain_config
from swiftspec.engines.serial import SerialEngine
from swiftspec.model import ModelArgs, Transformer
from swiftspec.speculate import TreeDrafter

# The GGUFs hold an output matrix of their own (tie_word_embeddings False as swiftspec reads them).
_QWEN = dict(arch="qwen2", rope_theta=1_000_000.0, qkv_bias=True, tie_word_embeddings=False,
             max_position_embeddings=32768, rms_norm_eps=1e-6)
TARGET_1_5B = ModelArgs(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                        num_kv_heads=2, head_dim=128, **_QWEN)  # Qwen2.5-Coder-1.5B-Instruct
DRAFT_0_5B = ModelArgs(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                       num_kv_heads=2, head_dim=64, **_QWEN)  # Qwen2.5-Coder-0.5B-Instruct
# The CPU rehearsal's pair: int4-packable (K a multiple of 128), head_dim a power of two >= 16.
_TINY = dict(_QWEN, vocab_size=512, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2,
             head_dim=32, max_position_embeddings=4096)
TINY_TARGET = ModelArgs(num_layers=2, **_TINY)
TINY_DRAFT = ModelArgs(num_layers=1, **_TINY)


@dataclass(frozen=True, slots=True)
class PairShapes:
    """The two models' shapes and a name for the report."""

    name: str
    target: ModelArgs
    draft: ModelArgs


DEFAULT_PAIR = PairShapes("qwen2.5-coder-1.5b + 0.5b shapes", TARGET_1_5B, DRAFT_0_5B)
TINY_PAIR = PairShapes("tiny (2 + 1 layers, hidden 128)", TINY_TARGET, TINY_DRAFT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where and how a random model is built: device, activation dtype, linear-weight format, seed."""

    device: str
    dtype: torch.dtype = torch.bfloat16
    weights: str = "bf16"  # bf16 | int8 | int4 (the packed formats run on the CPU only)
    seed: int = 0


class ByteTokenizer:
    """What the engines read of a tokenizer (their warm-up prompt's ids, the EOS ids): UTF-8 bytes
    as ids, and no EOS, so that every request decodes exactly the tokens it asks for."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids: frozenset[int] = frozenset()

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode()]


@dataclass(slots=True)
class RandomModel:
    """The fields of swiftspec.weights.loaded_model.LoadedModel that the engines read."""

    args: ModelArgs
    model: Transformer
    tokenizer: ByteTokenizer


def random_model(args: ModelArgs, place: Placement) -> RandomModel:
    """A decoder with seeded random dense weights (random_target and make_drafter pack them).  The
    values are drawn on the GPU when there is one (fast, and the same in every process), then
    copied to the model's device."""
    model = Transformer(args, dtype=place.dtype, device=place.device)
    draw = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(draw).manual_seed(place.seed)
    # testing/tiny.py's scales: small embeddings keep the residual stream dominated by the layers,
    # and a tied head's final-norm gain makes logits O(1) apart.
    gain = 0.5 * args.hidden_size**0.5 if args.tie_word_embeddings else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(gain if name == "model.norm.weight" else 1.0)
                continue
            std = 0.02 if "embed" in name else 0.1 if param.dim() == 1 else param.shape[1] ** -0.5
            param.copy_(torch.randn(param.shape, generator=gen, device=draw, dtype=torch.float32) * std)
    return RandomModel(args, model.eval(), ByteTokenizer(args.vocab_size))


def random_target(args: ModelArgs, place: Placement) -> RandomModel:
    """random_model packed as place.weights asks (runner.load.load_target's last step)."""
    target = random_model(args, place)
    kernels.prepare_model_(target.model, place.weights)
    return target


def make_drafter(draft: RandomModel, tree: TreeConfig, max_seq_len: int, weights: str,
                 draft_vocab: int) -> TreeDrafter:
    """speculate.drafter.build_drafter for a random draft: the pruned LM head keeps the first draft_vocab
    ids (the real pair's table needs the real tokenizer; with random weights any ids cost the same),
    beside the full head.  Takes a draft from random_model (dense: packed here)."""
    model = draft.model
    vocab = torch.arange(draft_vocab) if 0 < draft_vocab < draft.args.vocab_size else None
    head = None if vocab is None else model.lm_head.weight.data[vocab.to(model.device)].contiguous()  # [V', H]
    kernels.prepare_model_(model, weights)
    head = None if head is None else kernels.prepare_weight(head, weights)
    return TreeDrafter(model, tree, max_seq_len, vocab, head)


def fixed_tree(depth: int, tree: TreeConfig = TreeConfig()) -> TreeConfig:
    """Rounds of a fixed shape (d expansions of w leaves, bs verified nodes): the adaptive rules
    would read a random draft's near-uniform probabilities and end every round at once."""
    return dataclasses.replace(tree, depth=depth, adaptive=False, adaptive_verify=False)


def serial_engine(mode: str, target: RandomModel, draft: RandomModel | None, tree: TreeConfig,
                  max_seq_len: int, place: Placement, draft_vocab: int):
    """ar, chain or tree over the random pair (engines.build._build without the loading): a target
    from random_target, a fresh draft from random_model (its drafter packs it)."""
    if mode == "ar":
        return AutoregressiveEngine(target, max_seq_len)
    cfg = chain_config(tree) if mode == "chain" else tree
    return SerialEngine(target, make_drafter(draft, cfg, max_seq_len, place.weights, draft_vocab), cfg, max_seq_len)
