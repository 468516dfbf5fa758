"""No module-level import cycle among our packages, imports inside functions included.

import-linter checks the direction between packages and rooms; it does not forbid a cycle that
stays inside one contract's side, and a function-local import that closes a loop is how a cycle
usually sneaks back (`collectors.bpfenv` <-> `collectors.perf` <-> `collectors.config` was one).
This test parses every module with `ast` (nothing is imported), builds the graph module ->
modules it imports (every `import`/`from ... import` anywhere in the file, `if TYPE_CHECKING:`
ones too), and fails naming the modules of each cycle and one path around it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("perfbalance", "agent", "collectors", "rebalancer", "resctrl", "bpf")

Graph = Mapping[str, Iterable[str]]


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the packages (a package is its __init__)."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute name `from <dots><module> import` refers to, seen from `importer`."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([module] if module else []))


def _known(name: str, modules: Mapping[str, Path]) -> str:
    """The longest prefix of `name` that is one of our modules ("" for other packages)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str, tree: ast.AST, modules: Mapping[str, Path]) -> set[str]:
    """Our modules that `module` imports anywhere in its body (functions included)."""
    is_package = modules[module].name == "__init__.py"
    named: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, module, is_package)
            named += [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    found = {_known(n, modules) for n in named}
    return found - {"", module}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {m: imports_of(m, ast.parse(p.read_text(encoding="utf-8"), filename=str(p)), modules)
            for m, p in modules.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def path_around(graph: Graph, component: list[str]) -> list[str]:
    """One closed import path through the component's first module (breadth-first, shortest)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def describe(graph: Graph, found: list[list[str]]) -> str:
    return "\n".join(f"import cycle among {', '.join(c)}: {' -> '.join(path_around(graph, c))}"
                     for c in found)


# -- the cycle finder itself, on synthetic graphs -------------------------------------------------

def test_cycle_finder_reports_the_modules_of_a_cycle_and_a_path_around_it() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": set()}
    assert cycles(g) == [["a", "b", "c"]]
    assert describe(g, cycles(g)) == "import cycle among a, b, c: a -> b -> c -> a"


def test_cycle_finder_reports_a_two_module_cycle() -> None:
    g = {"x": {"y"}, "y": {"x"}}
    assert describe(g, cycles(g)) == "import cycle among x, y: x -> y -> x"


def test_cycle_finder_finds_none_in_a_dag() -> None:
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_a_function_local_and_a_relative_import_are_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p import b\n    return b\n")
    (pkg / "b.py").write_text("from . import a\n")
    g = import_graph(tmp_path, ["p"])
    assert g["p.a"] == {"p", "p.b"} and g["p.b"] == {"p", "p.a"}
    assert cycles(g) == [["p.a", "p.b"]]


# -- our packages ---------------------------------------------------------------------------------

def test_our_packages_have_no_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 100, "the module walk found too few modules"
    found = cycles(graph)
    assert not found, describe(graph, found)
