"""The house rules hold for the whole package (sizes, tuple returns, no globals, one direction of
imports between the layers, no cycle between packages nor between the files of one), and the
checker catches a break of them."""

import importlib.util
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def style():
    spec = importlib.util.spec_from_file_location("check_style", ROOT / "tools" / "check_style.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_style"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_house_rules(style) -> None:
    assert style.check() == []


def test_no_cycle_between_packages(style) -> None:
    edges = {}
    for path in sorted((ROOT / "swiftspec").rglob("*.py")):
        rel = path.relative_to(ROOT / "swiftspec").with_suffix("").parts
        is_package = rel[-1] == "__init__"
        module = ".".join(("swiftspec",) + (rel[:-1] if is_package else rel))
        own = style.package_of(module)
        imports = style.imported_modules(module, is_package, style.ast.parse(path.read_text()))
        edges.setdefault(own, set()).update(style.package_of(n) for _, n in imports)
    edges = {a: {b for b in bs if b not in (None, a)} for a, bs in edges.items() if a is not None}
    assert edges["engines"] and style.package_cycle(edges) == []
    assert style.package_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    package = tmp_path / "swiftspec"
    shutil.copytree(ROOT / "swiftspec", package, ignore=shutil.ignore_patterns("csrc", "__pycache__", "*.so"))
    return package


def _plant(package: pathlib.Path, rel: str, line: str) -> None:
    path = package / rel
    path.write_text(path.read_text() + "\n\n" + line + "\n")


def test_checker_fails_on_an_upward_lazy_import(style, tmp_path) -> None:
    package = _copy(tmp_path)
    assert style.check(package) == []
    _plant(package, "runner/model_runner.py", "def _up():\n    from swiftspec.engines import build_engine  # noqa\n")
    problems = style.check(package)
    assert any("runner/model_runner.py" in p and "from a layer above it" in p for p in problems)
    assert any("import cycle between packages" in p for p in problems)


def test_checker_fails_when_serve_and_bench_meet(style, tmp_path) -> None:
    package = _copy(tmp_path)
    _plant(package, "serve/metrics.py", "from swiftspec import bench  # noqa")
    assert any("serve and bench stay independent" in p for p in style.check(package))


def test_checker_fails_on_a_lazy_import_cycle_between_files(style, tmp_path) -> None:
    package = _copy(tmp_path)
    _plant(package, "kernels/packed.py", "def _up():\n    from swiftspec.kernels import linear  # noqa")
    problems = style.check(package)
    assert any("import cycle between files: swiftspec.kernels -> " in p and "swiftspec.kernels.packed" in p
               for p in problems)


def test_kernels_file_graph_is_acyclic_with_packed_at_the_bottom(style) -> None:
    lines = style.graph_lines(ROOT / "swiftspec" / "kernels")
    assert not any(line.startswith("cycle:") for line in lines)
    graph = dict(line.split(" -> ") for line in lines)
    assert graph["packed"] == "(none)" and graph["quant"] == "cpu_ext, packed"
    assert graph["kquant"] == "cpu_ext, packed" and "quant" not in graph["qblock"].split(", ")
    assert lines.index("packed -> (none)") < lines.index(f"kquant -> {graph['kquant']}")


def test_file_cycles_are_found_and_imports_resolve_to_files(style) -> None:
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"d"}}
    assert style.cycle_groups(edges) == [frozenset("ab"), frozenset("d")]
    files = {"swiftspec.kernels", "swiftspec.kernels.packed", "swiftspec.kernels.quant"}
    tree = style.ast.parse("def f():\n    from swiftspec.kernels import linear, packed\nimport torch")
    assert sorted(style.imported_files("swiftspec.kernels.quant", False, tree, files)) == [
        (2, "swiftspec.kernels"), (2, "swiftspec.kernels.packed")]
