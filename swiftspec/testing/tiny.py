"""Tiny random checkpoints for the tests, the kernel benches and the CUDA start-up check: HF
directories (weights + a real BPE tokenizer) and GGUF exports.

Everything is built offline and deterministically from a seed in well under a second, and the
directories load both in SwiftSpec and in transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from swiftspec.kernels.kquant import BLOCK_BYTES
from swiftspec.model.args import ModelArgs
from swiftspec.model.hf_args import model_args
from swiftspec.weights.gguf import hf_to_gguf_name, llama_permute
from swiftspec.weights.gguf_arch import DEFAULT_SWA_PATTERN, swa_layers
from swiftspec.weights.tokenizer_cache import hf_config

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5-Coder's fill-in-the-middle and repository tokens, for a tiny model that can serve FIM.
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
EOS_TOKEN = "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split (the GGUF export declares pre-tokenizer "qwen2" to match).
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS = """\
def add(a, b):
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


def fibonacci(n: int) -> list[int]:
    result = [0, 1]
    for i in range(2, n):
        result.append(result[i - 1] + result[i - 2])
    return result[:n]


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()


for number in range(10):
    if number % 2 == 0:
        print(f"{number} is even")
    else:
        print(f"{number} is odd")

The quick brown fox jumps over the lazy dog. A speculative decoder drafts several tokens with a
small model and verifies them with the large one in a single forward pass, so the output is the
same as the large model's while the latency per token goes down. Hello, world! How are you today?
Write a function that returns the largest element of a list, and test it with a few examples.
Numbers like 42, 3.14159 and 1e-6 appear in code; so do strings, lists, dicts and tuples.
Unicode text such as café, naïve, 日本語 and emoji 🙂 must survive encoding and decoding.
"""


def build_tokenizer(vocab_size: int, fim: bool = False) -> Tokenizer:
    """A byte-level BPE with Qwen-style special tokens appended (FIM_TOKENS too if `fim`); at most
    vocab_size entries."""
    special = SPECIAL_TOKENS + (FIM_TOKENS if fim else ())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    tok.add_special_tokens(list(special))
    return tok


def make_tiny_checkpoint(
    path: Path,
    arch: str = "qwen2",
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool | None = None,
    fim: bool = False,
) -> Path:
    """Write config.json, model.safetensors (random weights), tokenizer.json and tokenizer_config.json.

    Tied embeddings default to on for qwen2 and off for llama, like the small models of each family.
    `fim` adds Qwen2.5-Coder's fill-in-the-middle tokens to the vocabulary (FIM_TOKENS).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, fim)
    args = ModelArgs(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        rope_theta=10000.0,
        qkv_bias=arch == "qwen2",
        tie_word_embeddings=(arch == "qwen2") if tie_word_embeddings is None else tie_word_embeddings,
        max_position_embeddings=max_position_embeddings,
    )
    save_file(random_weights(args, seed), str(path / "model.safetensors"), metadata={"format": "pt"})
    eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id("<|endoftext|>")
    config = hf_config(args, torch.float32) | {"eos_token_id": eos, "pad_token_id": pad, "bos_token_id": None}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(tok, path, max_position_embeddings)
    return path


def random_weights(args: ModelArgs, seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 weights at a scale where activations stay O(1) and logits are O(1) apart."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    h, q, kv = args.hidden_size, args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    # Small embeddings keep the residual stream dominated by the layers: with tied embeddings a
    # large one makes every token predict itself. The final norm then restores O(1) logits.
    final_gain = 0.5 * h**0.5 if args.tie_word_embeddings else 1.0
    w = {
        "model.embed_tokens.weight": normal(args.vocab_size, h, std=0.02),
        "model.norm.weight": final_gain * (1 + normal(h, std=0.1)),
    }
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                  "self_attn.o_proj": (h, q), "mlp.gate_proj": (args.intermediate_size, h),
                  "mlp.up_proj": (args.intermediate_size, h), "mlp.down_proj": (h, args.intermediate_size)}
        for name, (rows, cols) in shapes.items():
            w[f"{p}{name}.weight"] = normal(rows, cols, std=cols**-0.5)
            if args.qkv_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                w[f"{p}{name}.bias"] = normal(rows, std=0.1)
        w[f"{p}input_layernorm.weight"] = 1 + normal(h, std=0.1)
        w[f"{p}post_attention_layernorm.weight"] = 1 + normal(h, std=0.1)
    if not args.tie_word_embeddings:
        w["lm_head.weight"] = normal(args.vocab_size, h, std=h**-0.5)
    return w


def make_perturbed_draft(target_dir: Path, out_dir: Path, noise: float = 0.05, seed: int = 1) -> Path:
    """Copy target_dir with every weight perturbed by noise * (its std) Gaussian noise: a toy draft."""
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target_dir / name, out_dir / name)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    with safe_open(target_dir / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            weights[name] = t + noise * t.std() * torch.randn(t.shape, generator=gen)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def write_gguf(hf_dir: Path, out: Path, qtype: str = "F32") -> Path:
    """Export a tiny HF directory as a llama.cpp-style GGUF (Q/K rows permuted for llama, Gemma's
    norms stored as 1 + w, each family's metadata as llama.cpp's converter writes it).

    qtype names the type of the 2-D weights (F32, F16, Q8_0, Q5_0, ...); norms stay F32 as in
    llama.cpp. The tokenizer is written as GGUF metadata, chat template included.  "Q4_K" and
    "Q5_K" (which gguf-py cannot quantize to) write random K-quant blocks instead of the weights,
    Q6_K for v_proj and down_proj as in a Q4_K_M / Q5_K_M file (2-D weights need K % 256 == 0).
    """
    hf_dir, out = Path(hf_dir), Path(out)
    args = model_args(json.loads((hf_dir / "config.json").read_text()))
    writer = gguf.GGUFWriter(str(out), args.arch)
    _gguf_hparams(writer, args)
    _gguf_tokenizer(writer, hf_dir)
    kind = gguf.GGMLQuantizationType[qtype]
    with safe_open(hf_dir / "model.safetensors", framework="np") as f:
        for name in f.keys():
            data = f.get_tensor(name).astype(np.float32)
            if args.gemma and name.endswith("norm.weight"):
                data = data + np.float32(1.0)
            if args.arch == "llama" and ".q_proj." in name:
                data = llama_permute(data, args.num_heads)
            elif args.arch == "llama" and ".k_proj." in name:
                data = llama_permute(data, args.num_kv_heads)
            tensor_type = kind if data.ndim == 2 else gguf.GGMLQuantizationType.F32
            if tensor_type.name in ("Q4_K", "Q5_K"):
                mixed = ".v_proj." in name or ".down_proj." in name
                tensor_type = gguf.GGMLQuantizationType.Q6_K if mixed else tensor_type
                packed = random_kquant_blocks(*data.shape, tensor_type.name, seed=len(name))
            else:
                packed = gguf.quants.quantize(data, tensor_type)
            writer.add_tensor(hf_to_gguf_name(name, args.arch), packed, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _gguf_hparams(writer, args: ModelArgs) -> None:  # writer: gguf.GGUFWriter

    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_block_count(args.num_layers)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.rms_norm_eps)
    if args.head_dim != args.hidden_size // args.num_heads:
        writer.add_key_length(args.head_dim)
        writer.add_value_length(args.head_dim)
    s = args.rope_scaling
    if s.kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType(s.kind))
        writer.add_rope_scaling_factor(s.factor)
    if s.kind == "yarn":
        writer.add_rope_scaling_orig_ctx_len(s.original_max_position)
    if args.sliding_window is not None:
        writer.add_sliding_window(args.sliding_window)
    if args.gemma:
        _gguf_gemma(writer, args)


def _gguf_gemma(writer, args: ModelArgs) -> None:  # writer: gguf.GGUFWriter
    """Gemma's soft-caps, its layer pattern where llama.cpp's default would differ, Gemma 3's local theta."""
    if args.query_pre_attn_scalar != args.head_dim:
        raise ValueError("llama.cpp's Gemma GGUFs imply query_pre_attn_scalar = head_dim (below 27B)")
    if args.attn_softcap is not None:
        writer.add_attn_logit_softcapping(args.attn_softcap)
    if args.final_softcap is not None:
        writer.add_final_logit_softcapping(args.final_softcap)
    if args.sliding_layers and args.sliding_layers != swa_layers(DEFAULT_SWA_PATTERN[args.arch], args.num_layers):
        writer.add_sliding_window_pattern(list(args.sliding_layers))
    if args.arch == "gemma3":
        writer.add_rope_freq_base_swa(args.local_rope_theta)


def _gguf_tokenizer(writer, hf_dir: Path) -> None:  # writer: gguf.GGUFWriter
    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    tokens = {i: t for t, i in spec["model"]["vocab"].items()}
    special = {a["id"] for a in spec["added_tokens"] if a["special"]}
    tokens.update({a["id"]: a["content"] for a in spec["added_tokens"]})
    ids = sorted(tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([tokens[i] for i in ids])
    writer.add_token_types([3 if i in special else 1 for i in ids])  # 3 = CONTROL, 1 = NORMAL
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    vocab = {t: i for i, t in tokens.items()}
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(config["chat_template"])


def add_tokenizer(path: Path, vocab_size: int, max_len: int = 512) -> Path:
    """Write the tiny BPE tokenizer (build_tokenizer) into an HF directory, e.g. one that
    transformers' save_pretrained wrote for a tiny random model of another family."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(build_tokenizer(vocab_size), path, max_len)
    return path


def _write_tokenizer(tok: Tokenizer, path: Path, max_len: int) -> None:
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))



def random_kquant_blocks(n: int, k: int, qtype: str, seed: int = 0) -> np.ndarray:
    """[n, k/256 * block bytes] random Q4_K / Q5_K / Q6_K blocks (every bit pattern of quants and
    sub-block scales occurs) with sane fp16 block scales in [1e-4, 1.1e-3] (dmin too for Q4_K, Q5_K)."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n * k // 256, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scales = (rng.random((len(b), 2)) * 1e-3 + 1e-4).astype(np.float16).view(np.uint8)
    if qtype != "Q6_K":
        b[:, 0:4] = scales
    else:
        b[:, 208:210] = scales[:, :2]
    return b.reshape(n, -1)
