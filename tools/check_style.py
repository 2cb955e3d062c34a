"""House rules that a machine can check: file and function size, tuple returns, globals, layering,
import cycles between packages and between files.  `--graph FOLDER` prints a package's file-level
import graph instead."""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys
from dataclasses import dataclass

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
    ("engines",),  # the engines behind one interface (ar, serial, async), build_engine, auto, device, defaults
    ("distributed",),  # the async machinery: workers, message protocol, supervisor, worker group, draft host
    ("speculate",),  # speculation: TreeDrafter, prompt lookup, TreeVerifier
    ("runner", "testing"),  # execution: ModelRunner, CUDA graphs, loading a target ready to run; tiny test models
    ("weights", "model", "cache", "parallel", "kernels"),  # a model and what it runs on
    ("tree", "verify", "sampling", "tokenizer", "fim", "config", "errors", "trace"),  # pure logic and plain data
)
INDEPENDENT = {frozenset(("serve", "bench"))}
# Files of a package never import each other in a circle (lazy imports included), but for these
# groups of files, left to their owners' work in progress; a group leaves the list when it is fixed.
KNOWN_FILE_CYCLES: set[frozenset[str]] = set()
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
    """swiftspec.engines.auto.store -> engines; swiftspec -> None (the root, below every layer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@dataclass(frozen=True)
class ImportStmt:
    """One imported module of a file: `import a.b` names a.b; `from a.b import c, d` names a.b and
    takes (c, d).  Relative imports are resolved."""

    line: int
    module: str
    names: tuple[str, ...] = ()


def import_statements(module: str, is_package: bool, tree: ast.AST) -> list[ImportStmt]:
    """Every import of a file (module `module`), lazy ones (inside functions) included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [ImportStmt(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.append(ImportStmt(node.lineno, base, tuple(a.name for a in node.names)))
    return found


def imported_modules(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every swiftspec import in a file, lazy ones included; relative imports
    resolved; `from swiftspec import kernels` counts as swiftspec.kernels."""
    found = []
    for stmt in import_statements(module, is_package, tree):
        if stmt.module == "swiftspec" and stmt.names:
            found += [(stmt.line, f"swiftspec.{name}") for name in stmt.names]
        else:
            found.append((stmt.line, stmt.module))
    return [(line, name) for line, name in found if name == "swiftspec" or name.startswith("swiftspec.")]


def _enclosing_file(name: str, files: set[str]) -> str | None:
    """The module of `files` that defines `name` (the longest prefix of it that is a file), or None."""
    parts = name.split(".")
    return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in files), None)


def imported_files(module: str, is_package: bool, tree: ast.AST, files: set[str]) -> list[tuple[int, str]]:
    """(line, file module) of every import of a file of `files` (the modules of swiftspec's files),
    lazy ones included: `from p import m` is an import of the file m where p.m is one (a submodule),
    else of p's file (p/__init__.py for a package).  Python also runs the __init__ files of the
    parent packages first; those implicit imports are not edges (every file would import its own
    package's __init__, and so sit in a cycle with it)."""
    found = []
    for stmt in import_statements(module, is_package, tree):
        subs = [sub for name in stmt.names if (sub := f"{stmt.module}.{name}") in files]
        targets = subs if stmt.names and len(subs) == len(stmt.names) else [*subs, _enclosing_file(stmt.module, files)]
        found += [(stmt.line, t) for t in targets if t is not None and t != module]
    return found


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


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """The nodes reached from `start` in one step or more."""
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += edges.get(node, ())
    return seen


def cycle_groups(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The groups of nodes that import each other in a circle (each node of a group reaches every
    other), in order of their first node."""
    reach = {node: _reachable(edges, node) for node in edges}
    groups: list[frozenset[str]] = []
    for node in sorted(edges):
        if node in reach[node] and not any(node in g for g in groups):
            groups.append(frozenset(other for other in reach[node] if node in reach.get(other, ())))
    return groups


def group_cycle(edges: dict[str, set[str]], group: frozenset[str]) -> list[str]:
    """One cycle through members of a cycle group (the first repeated last)."""
    return package_cycle({member: edges[member] & group for member in group})


def _module_of(package: pathlib.Path, path: pathlib.Path) -> tuple[str, bool]:
    """(module, is a package's __init__) of a file of the package rooted at `package`."""
    rel = path.relative_to(package).with_suffix("").parts
    is_package = rel[-1] == "__init__"
    return ".".join(("swiftspec",) + (rel[:-1] if is_package else rel)), is_package


def file_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """The file-level import graph of swiftspec: module -> the modules of the files it imports
    (lazy imports included, see imported_files)."""
    named = {path: _module_of(package, path) for path in sorted(package.rglob("*.py"))}
    files = {module for module, _ in named.values()}
    return {module: {t for _, t in imported_files(module, is_package, ast.parse(path.read_text()), files)}
            for path, (module, is_package) in named.items()}


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
        module, is_package = _module_of(package, path)
        imports = imported_modules(module, is_package, tree)
        problems += _function_problems(path, tree) + _pure_problems(path, package, imports)
        if package_of(module) is not None:
            problems += _layer_problems(path, module, imports)
            edges.setdefault(package_of(module), set()).update(
                package_of(n) for _, n in imports if package_of(n) not in (None, package_of(module)))
    if cycle := package_cycle(edges):
        problems.append(f"{package}: import cycle between packages: {' -> '.join(cycle)}")
    return problems + _file_cycle_problems(package)


def _file_cycle_problems(package: pathlib.Path) -> list[str]:
    graph = file_graph(package)
    groups = cycle_groups(graph)
    problems = [f"{package}: import cycle between files: {' -> '.join(group_cycle(graph, g))}"
                for g in groups if g not in KNOWN_FILE_CYCLES]
    return problems + [f"{package}: {' and '.join(sorted(g))} no longer import each other in a circle; "
                       "drop them from KNOWN_FILE_CYCLES" for g in KNOWN_FILE_CYCLES if g not in groups]


def graph_lines(folder: pathlib.Path, package: pathlib.Path = PACKAGE) -> list[str]:
    """The file-level import graph inside `folder` (a package of swiftspec), one line per file:
    `file -> the files of the folder it imports`, files that import none of the others first, each
    file after those it imports (alphabetical where the folder has a cycle)."""
    prefix = ".".join(("swiftspec",) + folder.resolve().relative_to(package).parts)
    graph = file_graph(package)
    inside = {m: {t for t in deps if t == prefix or t.startswith(prefix + ".")}
              for m, deps in graph.items() if m == prefix or m.startswith(prefix + ".")}
    cycles = [group_cycle(inside, g) for g in cycle_groups(inside)]
    depth: dict[str, int] = {}
    while not cycles and len(depth) < len(inside):
        depth.update({m: 1 + max((depth[t] for t in deps), default=-1) for m, deps in inside.items()
                      if m not in depth and all(t in depth for t in deps)})

    def short(module: str) -> str:
        return module[len(prefix) + 1:] or "__init__"

    lines = [f"{short(m)} -> {', '.join(sorted(map(short, inside[m]))) or '(none)'}"
             for m in sorted(inside, key=lambda m: (depth.get(m, 0), m))]
    return lines + [f"cycle: {' -> '.join(map(short, c))}" for c in cycles]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--graph", type=pathlib.Path, metavar="FOLDER",
                        help="print the file-level import graph of a package folder (e.g. swiftspec/kernels)")
    args = parser.parse_args()
    if args.graph is not None:
        print("\n".join(graph_lines(args.graph)))
        sys.exit(0)
    found = check()
    print("\n".join(found) or "style: ok")
    sys.exit(1 if found else 0)
