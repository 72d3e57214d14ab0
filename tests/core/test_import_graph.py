"""The core's modules import each other without a loop (issue 19: ``elastic -> engine -> policies``).

Every ``from rallypoint.core.X import`` / ``import rallypoint.core.X`` counts, function-local imports
included; imports under ``if TYPE_CHECKING:`` (annotations only) do not."""

from __future__ import annotations

import ast
from pathlib import Path

import rallypoint.core

CORE = Path(rallypoint.core.__file__).parent


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                mod = child.module
                if mod == "rallypoint.core":  # ``from rallypoint.core import reasons``
                    out.update(a.name for a in child.names)
                elif mod.startswith("rallypoint.core."):
                    out.add(mod.split(".")[2])
            elif isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.startswith("rallypoint.core."):
                        out.add(a.name.split(".")[2])
            walk(child)

    walk(tree)
    return out


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in CORE.glob("*.py") if p.stem not in ("__init__", "bench")}
    return {m: _imports(ast.parse((CORE / f"{m}.py").read_text())) & mods for m in sorted(mods)}


def test_core_modules_import_without_a_loop() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import loop: " + " -> ".join([*path[path.index(d) :], d]))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_elastic_does_not_import_the_engine() -> None:
    assert "engine" not in _graph()["elastic"]
