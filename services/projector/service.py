"""`rally serve projector`: follow the whole log into PostgreSQL (rally.jobs, rally.nodes, rally.events).

A thin shell: the projection, its batching, the exactly-once write and the PostgreSQL reconnects all
live in ``rallypoint.projection``. Run one replica per database; a second one is safe (the position
row fences it) but only wastes work re-synchronising. An event PostgreSQL refuses is quarantined, not
retried: ``/healthz`` says degraded and names it, ``/metrics`` counts it. See docs/projector.md.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from rallypoint.projection import DEFAULT_NAME, Projector, QuarantineCollector
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.health import add_health_check
from rallypoint.runtime.metrics import add_collector


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rally serve projector", description=__doc__)
    add_common_args(parser)
    parser.add_argument(
        "--postgres-dsn",
        default=os.environ.get("RALLY_POSTGRES_DSN"),
        help="PostgreSQL DSN of the read models (env RALLY_POSTGRES_DSN)",
    )
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="projection name, the key of its position row (default %(default)s)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=500, help="most events per transaction (default %(default)s)"
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=50.0,
        help="longest wait for a batch to fill after its first event (default %(default)s)",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=50_000,
        help="store the in-memory fold every N events, 0 to never (default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.postgres_dsn:
        parser.error("--postgres-dsn or RALLY_POSTGRES_DSN is required")
    config = ServiceConfig.from_args("projector", args)

    async def run(ctx: ServiceContext) -> int:
        log = await ctx.event_log()
        projector = Projector(
            log,
            args.postgres_dsn,
            name=args.name,
            batch_size=args.batch_size,
            batch_wait=args.batch_wait_ms / 1000.0,
            snapshot_every=args.snapshot_every,
        )
        ctx.stack.push_async_callback(projector.close)
        add_health_check(ctx, projector.degraded, degraded=True)
        add_collector(ctx, QuarantineCollector(projector))
        await projector.run(ctx.stop)
        return 0

    return run_service(run, config)


if __name__ == "__main__":
    raise SystemExit(main())
