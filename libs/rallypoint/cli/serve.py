"""`rally serve NAME ...`: run one service in this process, as its own deployment would."""

from __future__ import annotations

import argparse
import importlib
import sys

SERVICES: tuple[str, ...] = (
    "api",
    "inventory",
    "health-monitor",
    "scheduler",
    "preemption",
    "checkpoint",
    "job-controller",
    "projector",
    "predictor",
    "agent",
)


def service_module(name: str) -> str:
    return f"rallypoint_services.{name.replace('-', '_')}.service"


def _serve(args: argparse.Namespace) -> int:
    module = importlib.import_module(service_module(args.service))
    return int(module.main(list(args.service_args)))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one service (api, scheduler, agent, ...) in the foreground",
        description="Run one Rallypoint service. Arguments after the name go to the service "
        "(try `rally serve scheduler --help`).",
    )
    parser.add_argument("service", choices=SERVICES)
    parser.add_argument("service_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=_serve)


def run(argv: list[str]) -> int:
    """`python -m rallypoint.cli.serve NAME ...`: what the local cluster spawns (skips the full CLI)."""
    if not argv or argv[0] not in SERVICES:
        print(f"usage: python -m rallypoint.cli.serve {{{','.join(SERVICES)}}} ...", file=sys.stderr)
        return 2
    module = importlib.import_module(service_module(argv[0]))
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
