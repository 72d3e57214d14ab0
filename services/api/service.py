"""`rally serve api`: connect to the log, fold it, serve HTTP until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from aiohttp import web

from rallypoint.control.drain_flags import add_drain_policy_args, drain_policy_from_args
from rallypoint.jobs import DEFAULT_MAX_GPUS_PER_NODE
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.service import MainFn
from rallypoint.scheduling.queues import Queues, QueuesError, load_queues
from rallypoint.security.tokens import TokenStore

from .app import ApiConfig, build_app
from .fold import FoldFollower

SERVICE = "api"
CHECKPOINT_ROOT_ENV = "RALLY_CHECKPOINT_ROOT"
#: `rally up`'s (its --data-dir's default, .rally/local, and the local cluster's checkpoints folder in it).
LOCAL_CHECKPOINT_ROOT = ".rally/local/checkpoints"

_log = logging.getLogger("rallypoint.api")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rally serve api", description="Rallypoint HTTP API.")
    add_common_args(parser)
    parser.add_argument("--http-host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--http-port", type=int, default=8080, help="port to listen on")
    parser.add_argument(
        "--max-gpus-per-node",
        type=int,
        default=DEFAULT_MAX_GPUS_PER_NODE,
        help="task size bound used until a node has registered (default %(default)s)",
    )
    parser.add_argument(
        "--tokens-file",
        default=os.environ.get("RALLY_TOKENS_FILE"),
        help="the API tokens (`rally tokens create`), re-read when it changes; required "
        "(default $RALLY_TOKENS_FILE)",
    )
    parser.add_argument(
        "--checkpoint-root",
        type=checkpoint_root,
        default=os.environ.get(CHECKPOINT_ROOT_ENV, LOCAL_CHECKPOINT_ROOT),
        help="the shared folder of the jobs' checkpoints, as the job controller's --checkpoint-root: a "
        "job's own checkpoint_dir must lie in ROOT/<team>/ (default $RALLY_CHECKPOINT_ROOT, else "
        "%(default)s, `rally up`'s, resolved against the working directory)",
    )
    parser.add_argument(
        "--queues",
        default=None,
        help="the scheduler's queue file: each team's max_priority is enforced at submission",
    )
    # the job controller's drain policy: the job and node views show each draining gang's plan under it
    add_drain_policy_args(parser)
    return parser


def checkpoint_root(text: str) -> str:
    """The root as an absolute, normalized path: submissions are compared with it as text."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return os.path.abspath(text)


def make_main(args: argparse.Namespace, queues: Queues | None = None) -> MainFn:
    async def serve(ctx: ServiceContext) -> int:
        log = await ctx.event_log()
        config = ApiConfig(
            source=f"rallypoint/api/{ctx.config.instance}",
            max_gpus_per_node=args.max_gpus_per_node,
            queues=queues,
            checkpoint_root=args.checkpoint_root,
            drain=drain_policy_from_args(args),
        )
        follower = FoldFollower(log, await ctx.snapshots(), settle=True)
        auth = TokenStore(Path(args.tokens_file))
        app = build_app(log, config=config, follower=follower, auth=auth)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # Registered after the NATS connection, so it runs first on exit: stop HTTP, then drain NATS.
        ctx.stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, args.http_host, args.http_port).start()
        _log.info("api listening on http://%s:%d", args.http_host, args.http_port)
        await ctx.stop.wait()
        return 0

    return serve


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.tokens_file:
        # Never serve without authentication: anyone could submit commands that run on the nodes.
        parser.error(
            "--tokens-file (or $RALLY_TOKENS_FILE) is required; create one with `rally tokens create`"
        )
    try:
        queues = load_queues(args.queues) if args.queues else None
    except QueuesError as exc:
        parser.error(str(exc))
    return run_service(make_main(args, queues), ServiceConfig.from_args(SERVICE, args))


if __name__ == "__main__":
    raise SystemExit(main())
