"""`rally serve NAME ...`: run one service in this process, as its own deployment would."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rallypoint.runtime.cohost import HOSTABLE, hosting_refusal, run_hosted

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


#: Separates the hosted services on ``host``'s command line.
HOST_SEPARATOR = "::"


def service_module(name: str) -> str:
    return f"rallypoint_services.{name.replace('-', '_')}.service"


def colocated_services(text: str) -> tuple[str, ...]:
    """``--colocate``'s value: services to host together, comma separated (argparse type)."""
    services = tuple(part.strip() for part in text.split(",") if part.strip())
    refusal = hosting_refusal(services)
    if refusal is not None:
        raise argparse.ArgumentTypeError(f"two or more of {', '.join(HOSTABLE)}, each once: {refusal}")
    return services


def host_groups(argv: Sequence[str]) -> list[list[str]]:
    """``SERVICE ARGS... :: SERVICE ARGS...`` split per service; ValueError naming what is wrong."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == HOST_SEPARATOR:
            groups.append([])
        else:
            groups[-1].append(arg)
    refusal = hosting_refusal([group[0] if group else "" for group in groups])
    if refusal is not None:
        raise ValueError(refusal)
    return groups


HOST_USAGE = (
    "usage: rally serve host SERVICE [ARGS...] :: SERVICE [ARGS...] ...\n"
    f"runs two or more of {', '.join(HOSTABLE)} in one process over one fold, each with its own "
    "arguments (its own --instance, --health-port and --nats-user with --nats-password-file); "
    'see docs/deployment.md, "Hosting the light services together"'
)


def _host(argv: Sequence[str]) -> int:
    if list(argv[:1]) in (["-h"], ["--help"]):
        print(HOST_USAGE)
        return 0
    try:
        groups = host_groups(argv)
    except ValueError as exc:
        print(f"rally serve host: {exc}\n{HOST_USAGE}", file=sys.stderr)
        return 2
    hosted = [importlib.import_module(service_module(group[0])).prepare(group[1:]) for group in groups]
    return run_hosted(hosted)


def _serve(args: argparse.Namespace) -> int:
    if args.service == "host":
        return _host(list(args.service_args))
    module = importlib.import_module(service_module(args.service))
    return int(module.main(list(args.service_args)))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one service (api, scheduler, agent, ...) in the foreground",
        description="Run one Rallypoint service. Arguments after the name go to the service "
        "(try `rally serve scheduler --help`).",
    )
    parser.add_argument(
        "service",
        choices=(*SERVICES, "host"),
        help="a service, or `host SERVICE ARGS... :: SERVICE ARGS...` to run several of "
        f"{', '.join(HOSTABLE)} in one process over one fold",
    )
    parser.add_argument("service_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=_serve)


def run(argv: list[str]) -> int:
    """`python -m rallypoint.cli.serve NAME ...`: what the local cluster spawns (skips the full CLI)."""
    if argv and argv[0] == "host":
        return _host(argv[1:])
    if not argv or argv[0] not in SERVICES:
        print(f"usage: python -m rallypoint.cli.serve {{{','.join(SERVICES)},host}} ...", file=sys.stderr)
        return 2
    module = importlib.import_module(service_module(argv[0]))
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
