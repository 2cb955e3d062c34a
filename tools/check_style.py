"""House rules that a machine can check: file and function size, tuple returns, globals, layering."""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "swiftspec"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_STEP_LINES = 40
# Pure modules may import only torch, the standard library and these swiftspec modules.
PURE = {"tree": ("swiftspec.tree", "swiftspec.config", "swiftspec.sampling", "swiftspec.errors"),
        "verify": ("swiftspec.verify", "swiftspec.tree", "swiftspec.config", "swiftspec.sampling", "swiftspec.errors"),
        "sampling.py": ("swiftspec.config", "swiftspec.errors")}


def _function_problems(path: pathlib.Path, tree: ast.AST) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            limit = MAX_STEP_LINES if node.name == "step" else MAX_FUNCTION_LINES
            if length > limit:
                problems.append(f"{path}:{node.lineno}: function {node.name} has {length} lines (> {limit})")
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) > 2:
            problems.append(f"{path}:{node.lineno}: returns a tuple of {len(node.value.elts)}; use a dataclass")
        if isinstance(node, ast.Global):
            problems.append(f"{path}:{node.lineno}: uses `global`")
    return problems


def _import_problems(path: pathlib.Path, tree: ast.AST) -> list[str]:
    rel = path.relative_to(PACKAGE).parts
    allowed = PURE.get(rel[0])
    if allowed is None:
        return []
    problems = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if name.startswith("swiftspec") and not name.startswith(allowed):
                problems.append(f"{path}:{node.lineno}: pure module imports {name}")
    return problems


def check() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            problems.append(f"{path}: {len(text.splitlines())} lines (> {MAX_FILE_LINES})")
        tree = ast.parse(text)
        if ast.get_docstring(tree) is None and path.name != "__init__.py":
            problems.append(f"{path}: no module docstring")
        problems += _function_problems(path, tree) + _import_problems(path, tree)
    return problems


if __name__ == "__main__":
    found = check()
    print("\n".join(found) or "style: ok")
    sys.exit(1 if found else 0)
