"""One output grammar for every `rally` command that prints: ``-o json|table`` (``--output``), with
``--json`` as the same ``-o json``, so a script never has to remember which command takes which.

``table`` is what a person reads (a table, or the command's one line); ``json`` is what a script parses:
the API's own answer where there is one, else one object naming what was done.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

FORMATS = ("table", "json")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=FORMATS, default="table", help="output format (default %(default)s)"
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="the same as -o json"
    )


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def emit(args: argparse.Namespace, data: Any, table: Callable[[Any], str]) -> int:
    """Print ``data`` as JSON or as ``table(data)``; exit code 0."""
    print(json.dumps(data, indent=2) if wants_json(args) else table(data))
    return 0
