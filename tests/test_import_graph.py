"""The import graph of ``autocompress``, ``tasks`` and ``flows``: no cycles, layers respected.

The graph is read from the source with ``ast`` (nothing is imported), counting every
``import`` statement that can run: at module level and inside functions, absolute and
relative (``from . import x``), ``from pkg import submodule`` as an edge to the
submodule. Imports under ``if TYPE_CHECKING:`` are left out: they never run, so they
cannot close a cycle. A cycle hidden inside a function still counts: it is what lets
two modules depend on each other without failing at import time, and it ties their
code (and the stages' cache keys, which follow imports) together.

Run as a script for the figures: ``python tests/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("autocompress", "tasks", "flows")

# Which of our packages each package may import (the layers, docs/architecture.md).
ALLOWED_LAYERS = {
    "autocompress": {"autocompress"},
    "tasks": {"autocompress", "tasks"},
    "flows": {"autocompress", "tasks", "flows"},
}
# The CLI ships inside the package but is the top layer: a command may start a flow, so
# it may import Prefect, ``tasks`` and ``flows``, but only inside the command's function,
# so that the rest of the CLI (and ``import autocompress``) runs without them.
CLI = ("autocompress.cli", "autocompress.commands")
ORCHESTRATION = ("prefect", "tasks", "flows")


@dataclass(frozen=True)
class Import:
    """One imported name: who imports what, and whether the statement sits in a function."""

    source: str
    target: str
    in_function: bool
    line: int


def module_files(repo: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of our packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path) -> list[Import]:
    """Every import statement of one file that can run, as imported module names.

    Names outside our packages are kept too (``prefect``, ``torch``) so the layer rules
    can see them; resolving ``from x import y`` to a submodule happens in ``build_graph``.
    """
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    _walk(tree, module, package, in_function=False, found=found)
    return found


def _walk(node: ast.AST, module: str, package: str, in_function: bool,
          found: list[Import]) -> None:
    for child in ast.iter_child_nodes(node):
        if _is_type_checking(child):
            continue  # never runs; ``else:`` branches are rare enough to ignore
        if isinstance(child, ast.Import):
            found.extend(Import(module, alias.name, in_function, child.lineno)
                         for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = _absolute(child.module, child.level, package)
            # ``from x import y``: y may be a submodule; keep both, the graph picks.
            found.extend(Import(module, f"{base}:{alias.name}", in_function, child.lineno)
                         for alias in child.names)
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                          | ast.Lambda)
        _walk(child, module, package, inner, found)


def _absolute(name: str | None, level: int, package: str) -> str:
    """The absolute module of ``from <level dots><name> import ...`` inside ``package``."""
    if not level:
        return name or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, name] if name else parts)


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def resolve(target: str, modules: dict[str, Path]) -> str:
    """``x:y`` (from x import y) -> ``x.y`` when that is one of our modules, else ``x``."""
    base, _, member = target.partition(":")
    if member and f"{base}.{member}" in modules:
        return f"{base}.{member}"
    return base


def all_imports(repo: Path = REPO) -> tuple[dict[str, Path], list[Import]]:
    """Our modules and every import they make, with targets resolved to module names."""
    modules = module_files(repo)
    found = []
    for name, path in modules.items():
        for imp in imports_of(name, path):
            found.append(Import(imp.source, resolve(imp.target, modules), imp.in_function,
                                imp.line))
    return modules, found


def build_graph(modules: dict[str, Path], found: list[Import]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (self-imports dropped)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in found:
        if imp.target in modules and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Depth-first search, iterative, in sorted order
    so the same graph always reports the same cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def _where(imp: Import, modules: dict[str, Path]) -> str:
    return f"{modules[imp.source].relative_to(REPO)}:{imp.line} imports {imp.target}"


# -- the tests ---------------------------------------------------------------------------


def test_no_import_cycles():
    modules, found = all_imports()
    cycle = find_cycle(build_graph(modules, found))
    assert cycle is None, (
        "import cycle: " + " -> ".join(cycle)
        + " (move the shared part into a module both can import, see docs/architecture.md)")


def test_cycle_finder_finds_a_planted_cycle():
    # A chain with a back-edge three steps down, beside an acyclic branch.
    graph = {"a": {"b", "x"}, "b": {"c"}, "c": {"d"}, "d": {"b"}, "x": set()}
    assert find_cycle(graph) == ["b", "c", "d", "b"]
    graph["d"] = set()
    assert find_cycle(graph) is None
    assert find_cycle({"self": {"self"}}) == ["self", "self"]


def test_real_cycle_is_seen_through_function_level_and_relative_imports(tmp_path):
    # The cycle only exists through an import inside a function and a relative one:
    # the graph must see both.
    pkg = tmp_path / "autocompress"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("def f():\n    from autocompress import two\n")
    (pkg / "two.py").write_text("from . import one\n")
    for other in ("tasks", "flows"):
        (tmp_path / other).mkdir()
    modules, found = all_imports(tmp_path)
    assert find_cycle(build_graph(modules, found)) == [
        "autocompress.one", "autocompress.two", "autocompress.one"]


def _is_cli(module: str) -> bool:
    return any(module == cli or module.startswith(cli + ".") for cli in CLI)


def test_library_never_imports_prefect():
    modules, found = all_imports()
    bad = [_where(imp, modules) for imp in found
           if imp.source.split(".")[0] == "autocompress" and not _is_cli(imp.source)
           and imp.target.split(".")[0] == "prefect"]
    assert not bad, "the library must run without Prefect: " + "; ".join(bad)


def test_layers_import_only_downwards():
    modules, found = all_imports()
    bad = [_where(imp, modules) for imp in found
           if imp.target.split(".")[0] in PACKAGES and not _is_cli(imp.source)
           and imp.target.split(".")[0] not in ALLOWED_LAYERS[imp.source.split(".")[0]]]
    assert not bad, ("autocompress imports neither tasks nor flows, tasks never imports "
                     "flows: " + "; ".join(bad))


def test_cli_starts_flows_only_from_inside_a_command():
    modules, found = all_imports()
    top_level = [_where(imp, modules) for imp in found
                 if _is_cli(imp.source) and not imp.in_function
                 and imp.target.split(".")[0] in ORCHESTRATION]
    assert not top_level, ("the CLI imports Prefect, tasks and flows only inside the "
                           "command that needs them: " + "; ".join(top_level))
    into_cli = [_where(imp, modules) for imp in found
                if _is_cli(imp.target) and not _is_cli(imp.source)
                and imp.source.split(".")[0] == "autocompress"]
    assert not into_cli, "the library never imports the CLI: " + "; ".join(into_cli)


def figures() -> dict[str, int]:
    """The counts quoted in docs and reviews: modules, edges, internal imports by place."""
    modules, found = all_imports()
    graph = build_graph(modules, found)
    internal = [imp for imp in found if imp.target in modules and imp.target != imp.source]
    return {
        "modules": len(modules),
        "edges": sum(len(targets) for targets in graph.values()),
        "internal imports": len(internal),
        "module-level": sum(not imp.in_function for imp in internal),
        "function-level": sum(imp.in_function for imp in internal),
        "function-level, all packages": sum(imp.in_function for imp in found),
    }


if __name__ == "__main__":
    for key, value in figures().items():
        print(f"{key}: {value}")
    modules, found = all_imports()
    graph = build_graph(modules, found)
    cycles = 0
    while (cycle := find_cycle(graph)) is not None:  # list each cycle by cutting its last edge
        print("cycle:", " -> ".join(cycle))
        graph[cycle[-2]].discard(cycle[-1])
        cycles += 1
    print(f"cycles: {cycles}")
    sys.exit(1 if cycles else 0)
