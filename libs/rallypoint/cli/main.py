"""Entry point of the `rally` console script.

Each command group lives in its own module exposing ``add_parser(subparsers)`` (or ``add_parsers``)
and sets ``func`` on its parser: a callable taking the parsed namespace and returning an exit code.
Command modules keep their heavy imports (simulator, matplotlib, services) inside their handlers, so
that building the parser stays cheap for `rally serve agent` on a GPU node.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "rallypoint.cli.serve",
    "rallypoint.cli.cluster_cmds",
    "rallypoint.cli.jobs_cmds",
    "rallypoint.cli.account_cmds",
    "rallypoint.cli.checkpoint_cmds",
    "rallypoint.cli.tokens_cmds",
    "rallypoint.cli.replay",
    "rallypoint.cli.schemas",
    "rallypoint.cli.projector_cmds",
    "rallypoint.cli.nats_cmds",
    "rallypoint.cli.bench",
    "rallypoint.cli.sim",
    "rallypoint.cli.trace",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rally",
        description="Rallypoint: gang scheduling for distributed training on shared GPU clusters.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        register: Callable[[argparse._SubParsersAction], None] | None = getattr(
            module, "add_parser", None
        ) or getattr(module, "add_parsers", None)
        if register is None:
            raise RuntimeError(f"{name} defines neither add_parser nor add_parsers")
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command != "serve":
        # Library warnings (a NATS connection closing at exit) are not for a CLI user's terminal;
        # services configure their own structured logging.
        logging.basicConfig(
            level=os.environ.get("RALLY_CLI_LOG_LEVEL", "ERROR"), format="%(levelname)s %(message)s"
        )
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
