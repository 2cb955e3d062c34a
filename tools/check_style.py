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
# The layers, top first; a package (a folder, or a module of the top level) imports only from its own
# layer and the layers below it, function-level (lazy) imports included.  Packages of one layer may
# import each other as long as the package graph stays acyclic (checked apart), except the pairs of
# INDEPENDENT, which never do.  `swiftspec` itself (its __version__) is below every layer.
LAYERS = (
    ("cli",),  # the `swiftspec` command: flags (engine_args) and the dispatch to the front ends
    ("serve", "bench"),  # front ends: the HTTP server, the benchmark harness
    ("runtime",),  # engines (ar, serial, async), build_engine, auto, async protocol, supervisor, trace, device
    ("spec",),  # speculation: TreeDrafter, prompt lookup, TreeVerifier
    ("exec",),  # execution: ModelRunner, CUDA graphs, loading a target ready to run
    ("weights", "model", "cache", "parallel", "kernels"),  # a model and what it runs on
    ("tree", "verify", "sampling", "tokenizer", "fim", "config", "errors"),  # pure logic and plain data
)
INDEPENDENT = {frozenset(("serve", "bench"))}
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


def package_of(module: str) -> str | None:
    """swiftspec.runtime.auto.store -> runtime; swiftspec -> None (the root, below every layer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imported_modules(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every swiftspec import in a file, lazy ones included; relative imports
    resolved; `from swiftspec import kernels` counts as swiftspec.kernels."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names] if base == "swiftspec" else [base]
            found += [(node.lineno, name) for name in names]
    return [(line, name) for line, name in found if name == "swiftspec" or name.startswith("swiftspec.")]


def layer_of(package: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if package in layer), None)


def _layer_problems(path: pathlib.Path, module: str, imports: list[tuple[int, str]]) -> list[str]:
    own = package_of(module)
    own_layer = layer_of(own)
    if own_layer is None:
        return [f"{path}: package {own} is in no layer of LAYERS"]
    problems = []
    for line, name in imports:
        other = package_of(name)
        if other is None or other == own:
            continue
        other_layer = layer_of(other)
        if other_layer is None:
            problems.append(f"{path}:{line}: {own} imports {name}, of a package in no layer of LAYERS")
        elif other_layer < own_layer:
            problems.append(f"{path}:{line}: {own} imports {name} from a layer above it")
        elif frozenset((own, other)) in INDEPENDENT:
            problems.append(f"{path}:{line}: {own} imports {name}; {own} and {other} stay independent")
    return problems


def _pure_problems(path: pathlib.Path, package: pathlib.Path, imports: list[tuple[int, str]]) -> list[str]:
    allowed = PURE.get(path.relative_to(package).parts[0])
    if allowed is None:
        return []
    return [f"{path}:{line}: pure module imports {name}" for line, name in imports
            if name != "swiftspec" and not name.startswith(allowed)]


def package_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the package graph (a list of packages, the first repeated last), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def check(package: pathlib.Path = PACKAGE) -> list[str]:
    problems = []
    edges: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            problems.append(f"{path}: {len(text.splitlines())} lines (> {MAX_FILE_LINES})")
        tree = ast.parse(text)
        if ast.get_docstring(tree) is None and path.name != "__init__.py":
            problems.append(f"{path}: no module docstring")
        rel = path.relative_to(package).with_suffix("").parts
        is_package = rel[-1] == "__init__"
        module = ".".join(("swiftspec",) + (rel[:-1] if is_package else rel))
        imports = imported_modules(module, is_package, tree)
        problems += _function_problems(path, tree) + _pure_problems(path, package, imports)
        if package_of(module) is not None:
            problems += _layer_problems(path, module, imports)
            edges.setdefault(package_of(module), set()).update(
                package_of(n) for _, n in imports if package_of(n) not in (None, package_of(module)))
    if cycle := package_cycle(edges):
        problems.append(f"{package}: import cycle between packages: {' -> '.join(cycle)}")
    return problems


if __name__ == "__main__":
    found = check()
    print("\n".join(found) or "style: ok")
    sys.exit(1 if found else 0)
