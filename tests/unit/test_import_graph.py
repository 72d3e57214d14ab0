"""No import circle in libs/rallypoint (issue 31, Build item 8), and the product never imports the benches.

The graph is static: every ``import`` of a ``rallypoint.*`` module in every module of the package, at the
top or inside a function (a lazy import hides a circle from the interpreter's start-up, not from a
reader), resolved to the module it names (a package is its ``__init__``; ``from pkg import name`` is
``pkg.name`` when that is a module, else ``pkg``, or the module a lazily exporting package names as the
name's home). Imports under ``if TYPE_CHECKING:`` run only for the type checker and are left out.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

LIBS = Path(__file__).resolve().parents[2] / "libs"
ROOT = "rallypoint"
BENCH = "rallypoint.bench"
#: Product modules allowed to import the benches: the CLI's `rally bench` command only.
BENCH_IMPORTERS = frozenset({"rallypoint.cli.bench"})

Graph = Mapping[str, frozenset[str]]


def module_name(path: Path, libs: Path) -> str:
    parts = list(path.relative_to(libs).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the tree, at any depth, except those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking_guard(child):
            for orelse in child.orelse:
                yield from runtime_imports(ast.Module(body=[orelse], type_ignores=[]))
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from runtime_imports(child)


def lazy_homes(tree: ast.Module, package: str) -> dict[str, str]:
    """Name -> module for a package that exports names on first use (``lazy_exports(__name__, HOMES, ...)``
    with HOMES a literal dict of relative module names): those names are imports too, made late."""
    literals = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    homes: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"):
            continue
        table = node.args[1] if len(node.args) > 1 else None
        table = literals.get(table.id) if isinstance(table, ast.Name) else table
        if isinstance(table, ast.Dict):
            for key, value in zip(table.keys, table.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    homes[str(key.value)] = package + str(value.value)
    return homes


def _absolute(node: ast.ImportFrom, importer: str, importer_is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    drop = node.level - 1 if importer_is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(
    node: ast.Import | ast.ImportFrom,
    importer: str,
    importer_is_package: bool,
    modules: frozenset[str],
    homes: Mapping[str, Mapping[str, str]],
) -> set[str]:
    """The rallypoint modules one import statement loads, each as named in ``modules``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    source = _absolute(node, importer, importer_is_package)
    found: set[str] = set()
    for alias in node.names:
        member = f"{source}.{alias.name}"
        if member in modules:
            found.add(member)
        elif alias.name in homes.get(source, {}):
            found.add(homes[source][alias.name])
        elif source in modules:
            found.add(source)
    return found


def import_graph(libs: Path) -> dict[str, frozenset[str]]:
    files = {module_name(path, libs): path for path in sorted((libs / ROOT).rglob("*.py"))}
    modules = frozenset(files)
    trees = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in files.items()}
    homes = {name: lazy_homes(tree, name) for name, tree in trees.items() if is_package(files[name])}
    graph: dict[str, frozenset[str]] = {}
    for name, tree in trees.items():
        targets: set[str] = set()
        for node in runtime_imports(tree):
            targets |= imported_modules(node, name, is_package(files[name]), modules, homes)
        # A package's own names are lazy imports of its parts: an edge like any other.
        targets |= set(homes.get(name, {}).values())
        targets.discard(name)
        graph[name] = frozenset(targets)
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, the list sorted (iterative: no recursion
    limit on a deep graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def one_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest circle through the component's first module, as a path that ends where it starts."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start} in {component}")


def describe(graph: Graph, components: list[list[str]]) -> str:
    return "\n".join(
        f"{len(component)} modules import each other, e.g. {' -> '.join(one_cycle(graph, component))}"
        for component in components
    )


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    package = tmp_path / ROOT
    (package / "pkg").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pkg" / "__init__.py").write_text(
        "from rallypoint.lazyexports import lazy_exports\n"
        "_HOMES = {'Thing': '.late'}\n"
        "__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())\n"
    )
    (package / "pkg" / "late.py").write_text("Thing = 1\n")
    (package / "pkg" / "sibling.py").write_text("from . import late\n")
    (package / "lazyexports.py").write_text("")
    (package / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import rallypoint.pkg.sibling\n"
        "if TYPE_CHECKING:\n    from rallypoint import typed_only\n"
        "def later() -> None:\n    from .pkg import Thing\n"
    )
    (package / "typed_only.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["rallypoint.top"] == {"rallypoint.pkg.sibling", "rallypoint.pkg.late"}
    assert graph["rallypoint.pkg.sibling"] == {"rallypoint.pkg.late"}
    assert graph["rallypoint.pkg"] == {"rallypoint.lazyexports", "rallypoint.pkg.late"}


def test_a_circle_is_found_and_named() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    components = strongly_connected(graph)
    assert components == [["a", "b", "c"]]
    assert describe(graph, components) == "3 modules import each other, e.g. a -> b -> c -> a"


@functools.cache
def libs_graph() -> dict[str, frozenset[str]]:
    return import_graph(LIBS)


def test_no_import_circle_in_libs() -> None:
    graph = libs_graph()
    components = strongly_connected(graph)
    assert not components, "import circles in libs/rallypoint:\n" + describe(graph, components)


def test_every_benchmark_lives_in_the_bench_package() -> None:
    strays = sorted(
        name
        for name in libs_graph()
        if "bench" in name.rsplit(".", 1)[-1] and not name.startswith(BENCH) and name not in BENCH_IMPORTERS
    )
    assert not strays, f"benchmark modules outside {BENCH}: {strays}"


def test_the_product_never_imports_the_benches() -> None:
    graph = libs_graph()
    product = {name for name in graph if name != BENCH and not name.startswith(BENCH + ".")}
    offenders = sorted(
        f"{name} imports {target}"
        for name in product - BENCH_IMPORTERS
        for target in graph[name]
        if target == BENCH or target.startswith(BENCH + ".")
    )
    assert not offenders, "\n".join(offenders)
