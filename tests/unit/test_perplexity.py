"""`swiftspec perplexity`: llama-perplexity windows, the scoring, and every format on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from swiftspec.bench import perplexity
from swiftspec.errors import UserError


def test_windows_are_consecutive_and_whole() -> None:
    ids = list(range(100))
    assert perplexity.token_windows(ids, 16, 3) == [ids[0:16], ids[16:32], ids[32:48]]
    with pytest.raises(UserError, match="fewer than"):
        perplexity.token_windows(ids, 16, 7)
    with pytest.raises(UserError, match="even"):
        perplexity.token_windows(ids, 15, 1)


def test_scoring_uses_the_second_half_only() -> None:
    """Logits that put all mass on the right token give perplexity 1; uniform ones give V."""
    window, vocab = [3, 1, 4, 1, 5, 9, 2, 6], 10
    right = torch.full((3, vocab), -1e4)
    right[torch.arange(3), torch.tensor(window[5:])] = 0.0  # positions 4..6 predict tokens 5..7
    assert perplexity._scored([right], [window], "x").ppl == pytest.approx(1.0)
    flat = perplexity._scored([torch.zeros(3, vocab)], [window], "x")
    assert flat.ppl == pytest.approx(vocab) and flat.scored_tokens == 3


def test_every_format_on_a_tiny_model(tiny_qwen_dir, tmp_path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 60)
    rows = perplexity.measure(str(tiny_qwen_dir), str(text), ["file", "bf16", "int8"], 64, 2, False, 1)
    assert [r.label for r in rows] == ["file", "bf16", "int8"]  # (the tiny model's K = 64 is too small for int4)
    assert all(math.isfinite(r.ppl) and r.ppl > 1 and r.scored_tokens == 2 * 31 for r in rows)
    ref = rows[0].ppl
    assert abs(rows[1].ppl / ref - 1) < 0.05  # bf16 rounding moves a random model's perplexity little
    assert "| int8 |" in "\n".join(perplexity.markdown(rows, "text.txt"))


def test_cli_bad_text(capsys) -> None:
    from swiftspec.cli.main import main

    assert main(["perplexity", "/nonexistent.txt", "--model", "/nonexistent-model"]) == 2
    assert "error:" in capsys.readouterr().err
