"""The decoder of every supported family (Llama 2/3/3.x, Mistral, Qwen2/2.5/3, Gemma 2/3 text) and its
HF-checkpoint weight routing.  Families differ by ModelArgs flags: Gemma's blocks are GemmaDecoderLayer,
everything else about them is in Attention and the layers.

Parameter names follow HF checkpoints after packing: q/k/v_proj become self_attn.qkv_proj and
gate/up_proj become mlp.gate_up_proj; `load_weights` routes the separate HF tensors into them.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from swiftspec import kernels
from swiftspec.cache.kv_cache import KVCache
from swiftspec.errors import UserError
from swiftspec.model.args import ModelArgs, RopeScaling
from swiftspec.model.attention import Attention, AttentionInputs, sliding_mask
from swiftspec.model.layers import GeGLU, GemmaRMSNorm, RMSNorm, RotaryEmbedding, SwiGLU
from swiftspec.parallel.linear import ParallelLMHead, VocabParallelEmbedding, default_weight_loader
from swiftspec.parallel.state import ParallelState

# HF name fragment -> (our packed parameter's fragment, shard id)
PACKED_NAMES = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
INITIAL_ROPE_LENGTH = 4096  # tables grow (doubling) when a larger cache is used


class WeightLoadError(UserError, ValueError):
    """A checkpoint whose tensor names or shapes do not match the model."""


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: ModelArgs, layer_idx: int, parallel: ParallelState,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device)
        self.self_attn = Attention(args, layer_idx, parallel, dtype, device)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device)
        self.mlp = SwiGLU(args.hidden_size, args.intermediate_size, parallel, dtype, device)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        x = x + self.self_attn(self.input_layernorm(x), inputs, cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fused_weights(self) -> kernels.LayerWeights:
        """This layer's weights as kernels.cpu_decoder takes them."""
        attn, mlp = self.self_attn, self.mlp
        return kernels.LayerWeights(
            input_norm=self.input_layernorm.weight, post_norm=self.post_attention_layernorm.weight,
            qkv=attn.qkv_proj.weight, qkv_bias=attn.qkv_proj.bias, o=attn.o_proj.weight, o_bias=attn.o_proj.bias,
            gate_up=mlp.gate_up_proj.weight, down=mlp.down_proj.weight,
        )

    def linears(self) -> list[nn.Module]:
        return [self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj]


class GemmaDecoderLayer(nn.Module):
    """Gemma 2/3 block: x + norm(attn(norm(x))), then x + norm(mlp(norm(x))); (1 + w) norms, GeGLU."""

    def __init__(self, args: ModelArgs, layer_idx: int, parallel: ParallelState,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps, dtype, device)
        self.self_attn = Attention(args, layer_idx, parallel, dtype, device)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, dtype, device)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps, dtype, device)
        self.mlp = GeGLU(h, args.intermediate_size, parallel, dtype, device)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps, dtype, device)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), inputs, cache))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def linears(self) -> list[nn.Module]:
        return [self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj]


class DecoderStack(nn.Module):
    """HF's `model.*`: token embedding, the decoder layers and the final norm."""

    def __init__(self, args: ModelArgs, parallel: ParallelState, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            args.vocab_size, args.hidden_size, parallel=parallel, dtype=dtype, device=device
        )
        layer = GemmaDecoderLayer if args.gemma else DecoderLayer
        self.layers = nn.ModuleList(layer(args, i, parallel, dtype, device) for i in range(args.num_layers))
        self.norm = (GemmaRMSNorm if args.gemma else RMSNorm)(args.hidden_size, args.rms_norm_eps, dtype, device)
        self.embed_scale = args.hidden_size**0.5 if args.gemma else None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] int64 -> embeddings [T, hidden] (Gemma's times sqrt(hidden), rounded to the dtype first)."""
        x = self.embed_tokens(tokens)
        if self.embed_scale is None:
            return x
        return x * torch.tensor(self.embed_scale, dtype=x.dtype)

    def forward(self, tokens: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """tokens [T] int64 -> normed hidden states [T, hidden]."""
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, inputs, cache)
        return self.norm(x)


class Transformer(nn.Module):
    """A decoder over an explicit KV cache: forward() -> hidden, logits() -> float32 logits."""

    def __init__(self, args: ModelArgs, parallel: ParallelState = ParallelState(),
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.args = args
        self.parallel = parallel
        self.dtype = dtype
        self.device = torch.device(device)
        self.model = DecoderStack(args, parallel, dtype, device)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, parallel=parallel, dtype=dtype, device=device)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attn = self.model.layers[0].self_attn
        self.num_kv_heads = attn.num_kv_heads  # local to this rank
        self.group = attn.num_heads // attn.num_kv_heads  # query heads per KV head on this rank
        self.rope = RotaryEmbedding(
            args.head_dim, args.rope_theta, args.rope_scaling,
            min(args.max_position_embeddings, INITIAL_ROPE_LENGTH), dtype, device,
        )
        self.local_rope = None if args.local_rope_theta is None else RotaryEmbedding(
            args.head_dim, args.local_rope_theta, RopeScaling(), self.rope.length, dtype, device)
        self.fuse_cpu_layers = True  # run few-row CPU calls through kernels.cpu_decoder where it applies
        self._linears = [m for layer in self.model.layers for m in layer.linears()]
        self._fused_key: list = []  # the linear weights self._fused was built from
        self._fused: kernels.CpuDecoder | None = None

    def new_cache(self, max_len: int) -> KVCache:
        """An empty cache shaped for this model on this rank (local KV heads, model dtype and device)."""
        return KVCache(self.args.num_layers, max_len, self.num_kv_heads, self.args.head_dim, self.dtype, self.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, slots: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Run T tokens (a prompt chunk, one decode token, or a token tree) through the decoder.

        tokens [T] int64, positions [T] int64 (RoPE positions, each < cache.max_len),
        slots [T] int64 (cache rows to write this call's K/V to), mask [T, S] bool (True = may
        attend; S = mask.shape[1] and every attended slot is < S). Returns hidden [T, hidden].
        """
        self.rope.ensure(cache.max_len)  # positions never exceed the cache length
        window = self.args.sliding_window
        if window is not None and not self.args.sliding_layers:  # every layer slides (Mistral)
            mask = sliding_mask(mask, window)
        fused = self._cpu_decoder(tokens.shape[0])
        if fused is not None:  # one C++ call runs every layer
            x = self.model.embed_tokens(tokens)  # [T, hidden]
            return fused(x, cache.k, cache.v, slots, self.rope.cos[positions], self.rope.sin[positions], mask)
        if self.args.plain:
            inputs = AttentionInputs.build(self.rope.angles(positions), slots, mask, self.group)
        else:
            inputs = self._featured_inputs(positions, slots, mask, cache.max_len)
        return self.model(tokens, inputs, cache)

    def _featured_inputs(self, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                         max_len: int) -> AttentionInputs:
        """AttentionInputs with the sliding layers' mask and RoPE (Gemma): positions, slots [T],
        mask [T, S] as forward takes them."""
        window = self.args.sliding_window if self.args.sliding_layers else None
        local = None
        if self.local_rope is not None:
            self.local_rope.ensure(max_len)
            local = self.local_rope.angles(positions)
        return AttentionInputs.build(self.rope.angles(positions), slots, mask, self.group, local_rope=local,
                                     window_mask=None if window is None else sliding_mask(mask, window))

    def _cpu_decoder(self, rows: int) -> kernels.CpuDecoder | None:
        """The fused CPU forward of the layers (kernels.cpu_decoder) for a call of `rows` tokens, or
        None where it does not apply; rebuilt whenever a linear weight was replaced (prepare_model_
        packs them after loading; loads copy into the same tensors, which the fused forward shares)."""
        if not 1 <= rows <= kernels.MAX_DECODER_ROWS or not self.fuse_cpu_layers or self.parallel.tp_size > 1 \
                or self.device.type != "cpu" or not self.args.plain:
            return None
        weights = [m.weight for m in self._linears]
        if len(weights) != len(self._fused_key) or any(a is not b for a, b in zip(weights, self._fused_key)):
            self._fused_key = weights
            self._fused = kernels.cpu_decoder(
                [layer.fused_weights() for layer in self.model.layers], self.model.norm.weight,
                self.args.rms_norm_eps, self.group * self.num_kv_heads, self.num_kv_heads, self.args.head_dim,
            )
        return self._fused

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> logits [T, vocab] float32 (soft-capped where the model says: Gemma 2)."""
        logits = self.lm_head(hidden).float()
        cap = self.args.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]], supplied: frozenset[str] = frozenset()) -> None:
        """Load HF-named tensors (q/k/v and gate/up separate), each rank taking its shard.
        `supplied`: HF names the caller sets otherwise (GGUF blocks packed as stored); they count
        as loaded.

        Raises WeightLoadError naming the missing and unexpected tensors, or a mismatched shape.
        """
        params = dict(self.named_parameters())
        loaded: set[tuple[str, object]] = {_route(n) for n in supplied}
        unexpected: list[str] = []
        for hf_name, tensor in named:
            if self._ignored(hf_name):
                continue
            name, shard_id = _route(hf_name)
            param = params.get(name)
            if param is None:
                unexpected.append(hf_name)
                continue
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                with torch.no_grad():
                    loader(param, tensor, shard_id)
            except ValueError as err:
                raise WeightLoadError(f"checkpoint tensor {hf_name}: {err}") from err
            loaded.add((name, shard_id))
        expected = {(n, s) for n, p in params.items() for s in getattr(p, "shard_ids", (None,))}
        missing = sorted(_hf_name(n, s) for n, s in expected - loaded)
        if missing or unexpected:
            raise WeightLoadError(
                f"checkpoint does not match the {self.args.arch} model: "
                f"missing {_summary(missing)}; unexpected {_summary(sorted(unexpected))}"
            )

    def _ignored(self, hf_name: str) -> bool:
        """Tensors a checkpoint may carry that the model does not need."""
        if hf_name.endswith("rotary_emb.inv_freq"):  # old checkpoints store the RoPE table
            return True
        return self.args.tie_word_embeddings and hf_name == "lm_head.weight"  # a copy of embed_tokens


def _route(hf_name: str) -> tuple[str, object]:
    """HF tensor name -> (our parameter name, shard id or None)."""
    parts = hf_name.split(".")
    for i, part in enumerate(parts):
        if part in PACKED_NAMES:
            packed, shard_id = PACKED_NAMES[part]
            return ".".join(parts[:i] + [packed] + parts[i + 1 :]), shard_id
    return hf_name, None


def _hf_name(name: str, shard_id: object) -> str:
    """Our (parameter, shard id) -> the HF tensor name that supplies it."""
    if shard_id is None:
        return name
    for hf_part, (packed, sid) in PACKED_NAMES.items():
        if sid == shard_id and f".{packed}." in name:
            return name.replace(f".{packed}.", f".{hf_part}.")
    return f"{name}[{shard_id}]"


def _summary(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{len(names)} ({', '.join(names[:limit])}{more})"
