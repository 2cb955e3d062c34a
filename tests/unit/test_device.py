"""The default device is the CPU unless the CUDA path passed its start-up check on this machine."""

from __future__ import annotations

import json

import pytest
import torch

from swiftspec.engines import device


def test_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.default_device() == "cpu"


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, tmp_cache):
    """CUDA reported available, with a fake GPU name for the verdict's key; the check counts its runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    runs = []

    def check(path):
        runs.append(path)
        verdict = {"ok": fake_cuda_ok[0], "reason": "" if fake_cuda_ok[0] else "RuntimeError: no kernel image"}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(verdict))
        return verdict

    fake_cuda_ok = [True]
    monkeypatch.setattr(device, "_check_and_record", check)
    return runs, fake_cuda_ok


def test_cuda_once_its_check_passed(fake_cuda) -> None:
    runs, _ = fake_cuda
    assert device.default_device() == "cuda"
    assert device.default_device() == "cuda"
    assert len(runs) == 1  # the verdict is cached: later starts do not check again


def test_cpu_when_the_check_failed(fake_cuda, capsys: pytest.CaptureFixture) -> None:
    _, ok = fake_cuda
    ok[0] = False
    assert device.default_device() == "cpu"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the CUDA check failed here (RuntimeError: no kernel image)" in err


def test_env_keeps_the_cpu(fake_cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device.CUDA_ENV, "0")
    assert device.default_device() == "cpu"
    assert fake_cuda[0] == []


def test_the_check_itself_runs_on_cpu() -> None:
    """greedy_tokens is the check's workload; on CPU it must decode the requested tokens."""
    assert 0 < len(device.greedy_tokens("cpu")) <= device.CHECK_TOKENS
