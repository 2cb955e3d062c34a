"""The packed-draft cache (speculate/packed_drafts.py): a GGUF draft packed as int8/int4 is written once and
read back, tensor for tensor, as packing it again would give; a damaged entry is packed again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftspec.config import LoadConfig, TreeConfig
from swiftspec.kernels import PackedWeight
from swiftspec.runner.model_runner import causal_mask
from swiftspec.speculate import packed_drafts
from swiftspec.speculate.packed_drafts import load_drafter
from swiftspec.testing.tiny import make_tiny_checkpoint, write_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("draft")
    hf = make_tiny_checkpoint(root / "hf", arch="qwen2", hidden_size=256, num_layers=2, num_heads=4,
                              num_kv_heads=2, intermediate_size=512)
    return write_gguf(hf, root / "draft.gguf", "Q8_0")


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a packed model runs on: dense parameters and each packed weight's parts."""
    out = {name: p.data for name, p in model.named_parameters()}
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, PackedWeight):
            out |= {f"{name}.{w.fmt}.{w.shape}.{w.group_size}.{part}": t
                    for part, t in (("q", w.qweight), ("scale", w.scale), ("mins", w.mins)) if t is not None}
    return out


def _logits(drafter, ids: list[int]) -> torch.Tensor:
    runner = drafter.runner
    slots = runner.kv.append_prefix(list(ids))
    return runner.forward(torch.tensor(ids), slots, slots, causal_mask(0, len(ids), "cpu"))


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_packed_draft_reads_back_as_packed(draft_gguf: Path, tmp_cache: Path, weights: str, monkeypatch) -> None:
    load = LoadConfig(weights=weights)
    packed = load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    entries = list((tmp_cache / "drafts").iterdir())
    assert [p.suffix for p in entries] == [".safetensors"] and weights in entries[0].name
    with monkeypatch.context() as m:  # read from the entry: the file is neither decoded nor packed
        m.setattr(packed_drafts, "load_model", None)
        m.setattr(packed_drafts, "build_drafter", None)
        cached = load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    want, got = _tensors(packed.loaded.model), _tensors(cached.loaded.model)
    assert want.keys() == got.keys() and any(".q" in k for k in got)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    ids = [3, 17, 42, 5, 9]
    assert torch.equal(_logits(cached.drafter, ids), _logits(packed.drafter, ids))
    assert cached.loaded.tokenizer.encode("def f(x):") == packed.loaded.tokenizer.encode("def f(x):")


def test_a_damaged_entry_is_packed_again(draft_gguf: Path, tmp_cache: Path, caplog) -> None:
    load = LoadConfig(weights="int4")
    first = load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    entry = next((tmp_cache / "drafts").iterdir())
    entry.write_bytes(entry.read_bytes()[:1000])
    again = load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    assert "unreadable" in caplog.text
    assert torch.equal(_logits(again.drafter, [1, 2, 3]), _logits(first.drafter, [1, 2, 3]))
    assert entry.stat().st_size > 1000  # written again


def test_a_new_entry_replaces_the_stale_ones(draft_gguf: Path, tmp_cache: Path, monkeypatch) -> None:
    load = LoadConfig(weights="int4")
    load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    monkeypatch.setattr(packed_drafts, "CACHE_VERSION", packed_drafts.CACHE_VERSION + 1)  # as a kernel change would
    load_drafter(str(draft_gguf), load, TreeConfig(), 64, 0)
    load_drafter(str(draft_gguf), LoadConfig(weights="int8"), TreeConfig(), 64, 0)
    names = sorted(p.name for p in (tmp_cache / "drafts").iterdir())
    assert len(names) == 2 and "-int4-" in names[0] and "-int8-" in names[1]
    assert packed_drafts._entry(draft_gguf, load, 0).name in names


def test_only_packed_cpu_gguf_drafts_are_cached(draft_gguf: Path, tiny_qwen_dir: Path, tmp_cache: Path) -> None:
    load_drafter(str(draft_gguf), LoadConfig(weights="bf16"), TreeConfig(), 64, 0)
    load_drafter(str(tiny_qwen_dir), LoadConfig(weights="int8"), TreeConfig(), 64, 0)  # an HF directory
    assert not (tmp_cache / "drafts").exists()
