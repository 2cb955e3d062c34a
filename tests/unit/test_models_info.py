"""`swiftspec models info`: family, shape, tensor types and how each format runs a GGUF file or an
HF directory; a bad path or an unsupported architecture is one line."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from swiftspec.cli.main import main
from swiftspec.testing.tiny import make_tiny_checkpoint, write_gguf
from swiftspec.weights.describe import describe


def test_gguf_k_quants_run_as_stored(tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path / "hf", arch="qwen2", hidden_size=256, num_layers=1, num_heads=4,
                              num_kv_heads=2, intermediate_size=512, tie_word_embeddings=False)
    info = describe(write_gguf(hf, tmp_path / "m.gguf", "Q4_K"))
    assert info.family == "qwen2" and info.problem is None and info.args.hidden_size == 256
    # Q4_K_M-style: v_proj and down_proj are Q6_K; the embedding (Q4_K) is not a linear, the LM head is
    assert info.tensor_types == {"F32": 6, "Q4_K": 7, "Q6_K": 2}
    text = "\n".join(info.lines())
    assert "runs: yes" in text and "8 linear tensors run as stored (Q4_K x 6, Q6_K x 2)" in text
    assert "re-quantized" not in text and "fused decoder" in text


def test_gguf_without_native_kernel_is_requantized(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    text = "\n".join(describe(write_gguf(tiny_qwen_dir, tmp_path / "m.gguf", "Q4_1")).lines())
    # tied embeddings: 14 linears, the embedding (Q4_1 too) is dequantized
    assert ("no linear tensor is of a type run as stored (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0); 14 with no "
            "native kernel re-quantized to int8 (Q4_1 x 14)") in text
    text = "\n".join(describe(write_gguf(tiny_qwen_dir, tmp_path / "q8.gguf", "Q8_0")).lines())
    assert "14 linear tensors run as stored (Q8_0 x 14)" in text and "re-quantized" not in text


def test_hf_directory(tiny_llama_dir: Path, capsys) -> None:
    assert main(["models", "info", str(tiny_llama_dir)]) == 0
    out = capsys.readouterr().out
    assert "HF directory" in out and "family: llama (2 layers, hidden 64" in out and "F32 x 21" in out
    assert "runs: yes" in out


def test_unsupported_architecture_says_why(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "phi3.gguf"), "phi3")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    lines = describe(tmp_path / "phi3.gguf").lines()
    assert lines[1] == "  family: phi3" and lines[-1].startswith("  runs: no: unsupported architecture 'phi3'")


def test_bad_path_is_one_line_and_fails(tmp_path: Path, capsys) -> None:
    assert main(["models", "info", str(tmp_path / "missing.gguf")]) == 2
    assert capsys.readouterr().err == f"error: model not found: {tmp_path / 'missing.gguf'}\n"
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["models", "info", str(tmp_path / "notes.txt")]) == 2
    assert "neither a GGUF file nor an HF model directory" in capsys.readouterr().err
