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
import threading
from collections.abc import Callable, Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "rallypoint.cli.serve",
    "rallypoint.cli.cluster_cmds",
    "rallypoint.cli.jobs_cmds",
    "rallypoint.cli.interactive_cmds",
    "rallypoint.cli.why_cmds",
    "rallypoint.cli.predictions_cmds",
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

#: What a shell reports for a process a closed pipe stopped (128 + SIGPIPE): `rally jobs | head`.
EXIT_CLOSED_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rally",
        description="Rallypoint: gang scheduling for distributed training on shared GPU clusters.",
    )
    # not "command": `rally submit` names its program that (args.command), which would hide the choice
    subparsers = parser.add_subparsers(dest="rally_command", metavar="COMMAND")
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


def chosen_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command ``args`` was parsed for (``rally nodes drain``'s, not ``rally``'s)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            child = action.choices.get(getattr(args, action.dest, None) or "")
            if child is not None:
                return chosen_command(child, args)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse; a flag the command does not have is refused with THAT command's usage, not the top level's
    (argparse hands unknown flags up to ``rally``, whose usage lists only the commands)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        chosen_command(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _quiet_closed_outputs() -> None:
    """Point stdout and stderr at /dev/null where their reader is gone, so neither a later print nor the
    interpreter's flush at exit writes a BrokenPipeError traceback: `rally show J | head` ends quietly."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def _quiet_in_threads() -> None:
    """Wrap ``threading.excepthook`` (once) so a thread printing into a closed pipe ends quietly too."""
    hook = threading.excepthook
    if getattr(hook, "quiet_on_closed_pipe", False):
        return

    def quiet(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, BrokenPipeError):
            _quiet_closed_outputs()
            return
        hook(args)

    quiet.quiet_on_closed_pipe = True  # type: ignore[attr-defined]
    threading.excepthook = quiet


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, list(sys.argv[1:] if argv is None else argv))
    if args.rally_command != "serve":
        # Library warnings (a NATS connection closing at exit) are not for a CLI user's terminal;
        # services configure their own structured logging.
        logging.basicConfig(
            level=os.environ.get("RALLY_CLI_LOG_LEVEL", "ERROR"), format="%(levelname)s %(message)s"
        )
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    _quiet_in_threads()
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe can still be caught, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_closed_outputs()
        return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
