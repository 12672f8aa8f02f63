"""The import graph of the project's packages: no cycle among modules at import time, and the training CLI
never reaches into the sweep (the sweep builds on it, not the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("lit", "arch_plugins")


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run when the module is imported (functions and classes' bodies, and
    ``if TYPE_CHECKING:`` blocks, do not)."""
    out = []
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += _module_level(node.orelse)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            out.append(node)
            for block in ("body", "orelse", "finalbody"):
                out += _module_level(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                out += _module_level(handler.body)
        else:
            out.append(node)
    return out


def imports(module: str, path: Path, modules: set[str], deferred: bool = False) -> set[str]:
    """The project's modules ``module`` imports (at import time only, unless ``deferred``)."""
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if deferred else _module_level(tree.body)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from this module's package
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules and name != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    files = module_files()
    return {module: imports(module, path, set(files), deferred) for module, path in files.items()}


def test_no_import_cycle_at_import_time():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_training_cli_never_imports_the_sweep_or_the_command_table():
    graph = import_graph(deferred=True)
    assert "lit.cli" in graph["lit.sweep.command"]  # the sweep checks its variants with the training CLI
    assert {m for m in graph["lit.cli"] if m.startswith(("lit.sweep", "lit.compare", "lit.commands"))} == set()


def test_no_import_cycle_even_through_deferred_imports():
    # The rooms stand on floors: a function-level import that closes a loop (child -> ladder -> command -> child,
    # once) still ties the modules into one knot that cannot be read or tested apart.
    assert cycles(import_graph(deferred=True)) == []


def test_the_sweep_imports_nothing_from_compare():
    # The sweep's looks and compare's reports share one floor of pure statistics (lit/statistics): the sweep stands
    # on it, never on the comparison room above it, not even in a function-level import.
    graph = import_graph(deferred=True)
    upward = {(m, i) for m, imported in graph.items() if m.startswith("lit.sweep")
              for i in imported if i.startswith("lit.compare")}
    assert upward == set()
    assert "lit.statistics.sequential" in graph["lit.sweep.looks"]
    assert {i for i in graph["lit.statistics.sequential"] | graph["lit.statistics.paired_tests"]
            if not i.startswith("lit.statistics")} == set()  # the floor stands on nothing of ours
