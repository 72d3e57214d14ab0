"""Every ``rally`` command reachable from the console script runs a handler.

``rally.cli.main`` calls the ``func`` default of the parsed command; a command module that sets its
handler under another name parses fine and then prints the top-level help and exits 2, doing nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from test_cli_grammar import convert_sample  # this folder is on sys.path

from rallypoint.cli.main import build_parser, main


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) of every command that takes no further subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaves(child, (*path, name))


def test_every_leaf_command_has_a_handler() -> None:
    leaves = dict(_leaves(build_parser()))
    # the commands the README and docs promise are all there
    for expected in [("sim",), ("trace", "convert"), ("bench", "scheduler"), ("submit",), ("replay",)]:
        assert expected in leaves, list(leaves)
    missing = [" ".join(p) for p, parser in leaves.items() if not callable(parser.get_default("func"))]
    assert missing == []


def test_trace_convert_writes_its_files_through_main(tmp_path: Path) -> None:
    out = tmp_path / "converted"
    assert main(convert_sample(out)) == 0
    assert {p.name for p in out.iterdir()} >= {"workload.jsonl", "cluster.yaml"}


def test_building_the_parser_leaves_the_simulator_and_numpy_unimported() -> None:
    """`rally serve agent` on a GPU node builds the same parser: the heavy modules load in handlers."""
    import subprocess
    import sys

    code = (
        "import sys; from rallypoint.cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in ('numpy', 'rallypoint.sim.engine', 'rallypoint.core') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
