"""`rally nats`: set the log up as admin, render the NATS configs from the permission matrix, mint agent
passwords. See docs/deployment.md, "Who may write what"."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

from rallypoint.cli.clusterinfo import default_nats_url
from rallypoint.cli.output import add_output_args, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("nats", help="NATS setup, permission configs and agent credentials")
    commands = parser.add_subparsers(dest="nats_command", metavar="NATS_COMMAND")
    commands.required = True

    setup = commands.add_parser("setup", help="create the RALLY stream and the buckets (as admin)")
    setup.add_argument("--nats-url", default=None, help="an admin URL (default: RALLY_NATS_URL / rally up)")
    setup.add_argument("--replicas", type=int, default=int(os.environ.get("RALLY_STREAM_REPLICAS", "1")))
    add_output_args(setup)
    setup.set_defaults(func=_setup)

    config = commands.add_parser("config", help="write (or --check) the NATS configs under deploy/")
    config.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: .)")
    config.add_argument("--check", action="store_true", help="exit 1 if a committed file drifted")
    add_output_args(config)
    config.set_defaults(func=_config)

    mint = commands.add_parser("mint-agent", help="a new password for one node's agent user")
    mint.add_argument("--node-id", required=True)
    mint.add_argument("--out", type=Path, help="also write the password here (owner-only), for the node")
    add_output_args(mint)
    mint.set_defaults(func=_mint_agent)


def _setup(args: argparse.Namespace) -> int:
    from rallypoint.eventlog import connect_nats
    from rallypoint.eventlog.setup import setup_log

    async def run() -> None:
        nc = await connect_nats(args.nats_url or default_nats_url(), name="rally-nats-setup")
        try:
            await setup_log(nc, replicas=args.replicas)
        finally:
            await nc.close()

    asyncio.run(run())
    ready = {"stream": "RALLY", "replicas": args.replicas}
    return emit(args, ready, lambda r: f"stream RALLY and buckets ready ({r['replicas']} replicas)")


def _config(args: argparse.Namespace) -> int:
    from rallypoint.security import deployfiles

    root = args.root.resolve()
    if args.check:
        stale = deployfiles.drifted(root)
        for path in stale:
            print(f"{path} differs from the permission matrix: run `rally nats config`", file=sys.stderr)
        return 1 if stale else 0
    written = []
    for path, text in deployfiles.render(root).items():
        (root / path).write_text(text)
        written.append(str(path))
    return emit(args, {"wrote": written}, lambda r: "\n".join(f"wrote {path}" for path in r["wrote"]))


def _mint_agent(args: argparse.Namespace) -> int:
    from rallypoint.security import agent_user
    from rallypoint.security.natsconf import password_variable

    user = agent_user(args.node_id)
    password = f"p{secrets.token_hex(24)}"
    if args.out is not None:
        args.out.touch(mode=0o600, exist_ok=True)
        args.out.chmod(0o600)
        args.out.write_text(password + "\n")
    # For the NATS servers' secret (the server reads it as an environment variable).
    minted = {"variable": password_variable(user), "password": password}
    return emit(args, minted, lambda m: f"{m['variable']}={m['password']}")
