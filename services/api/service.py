"""`rally serve api`: connect to the log, fold it, serve HTTP until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from rallypoint.jobs import DEFAULT_MAX_GPUS_PER_NODE
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.service import MainFn

from .app import ApiConfig, build_app
from .fold import FoldFollower

SERVICE = "api"

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
    return parser


def make_main(args: argparse.Namespace) -> MainFn:
    async def serve(ctx: ServiceContext) -> int:
        log = await ctx.event_log()
        config = ApiConfig(
            source=f"rallypoint/api/{ctx.config.instance}", max_gpus_per_node=args.max_gpus_per_node
        )
        follower = FoldFollower(log, await ctx.snapshots())
        runner = web.AppRunner(build_app(log, config=config, follower=follower), access_log=None)
        await runner.setup()
        # Registered after the NATS connection, so it runs first on exit: stop HTTP, then drain NATS.
        ctx.stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, args.http_host, args.http_port).start()
        _log.info("api listening on http://%s:%d", args.http_host, args.http_port)
        await ctx.stop.wait()
        return 0

    return serve


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_service(make_main(args), ServiceConfig.from_args(SERVICE, args))


if __name__ == "__main__":
    raise SystemExit(main())
