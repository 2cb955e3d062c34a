"""The house rules hold for the whole package (sizes, tuple returns, no globals, pure layering)."""

import importlib.util
import pathlib


def test_house_rules() -> None:
    path = pathlib.Path(__file__).resolve().parents[2] / "tools" / "check_style.py"
    spec = importlib.util.spec_from_file_location("check_style", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.check() == []
