"""Inputs shared by the GPU-path tests: RoPE tables, token-tree masks and a tiny random model.

Nothing here imports swiftspec.weights' GGUF side: a GPU machine's own torch may lack gguf
(benchmarks/gpu_check.py runs these tests there with --noconftest)."""

from __future__ import annotations

import torch

from swiftspec.model import ModelArgs, Transformer
from swiftspec.model.args import RopeScaling
from swiftspec.model.layers import RotaryEmbedding


def rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] of positions [T] exactly as the model builds them (RopeAngles without the head axis)."""
    rope = RotaryEmbedding(head_dim, 10000.0, RopeScaling(), int(positions.max()) + 1, dtype, positions.device)
    angles = rope.angles(positions)
    return angles.cos[:, 0], angles.sin[:, 0]


def ancestor_mask(num_nodes: int, gen: torch.Generator) -> torch.Tensor:
    """[N, N] bool of a random tree (parent < child, node 0 the root): row i sees its ancestors and itself."""
    mask = torch.eye(num_nodes, dtype=torch.bool)
    for node in range(1, num_nodes):
        parent = int(torch.randint(0, node, (1,), generator=gen))
        mask[node] |= mask[parent]
    return mask


def tree_rows(prefix: int, num_nodes: int, rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[len(rows), prefix + N] bool: the given tree nodes (query rows) see the whole prefix and their
    ancestors; rows = all nodes is the target's square verification, a few leaves the draft's expansion."""
    tree = ancestor_mask(num_nodes, gen)[rows]  # [R, N]
    return torch.cat([torch.ones(rows.numel(), prefix, dtype=torch.bool), tree], dim=1)


def tiny_model(device: torch.device | str, dtype: torch.dtype = torch.float32, num_kv_heads: int = 2) -> Transformer:
    """A 2-layer Qwen2-style model with random weights; head_dim 16 so the Triton path applies on CUDA."""
    args = ModelArgs(arch="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=num_kv_heads, head_dim=16, rope_theta=10000.0, qkv_bias=True,
                     tie_word_embeddings=True, max_position_embeddings=512)
    model = Transformer(args, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the same values on every device: drawn on the CPU, then copied
        for name, param in model.named_parameters():
            std = 0.1 if param.dim() == 1 else param.shape[1] ** -0.5  # biases and norms; a linear's 1/sqrt(K)
            param.copy_(torch.randn(param.shape, generator=gen) * std + (1.0 if "norm" in name else 0.0))
    return model.eval()
