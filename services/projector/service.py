"""`rally serve projector`: follow the whole log into PostgreSQL (rally.jobs, rally.nodes, rally.events).

A thin shell: the projection, its batching, the exactly-once write and the PostgreSQL reconnects all
live in ``rallypoint.projection``. Any number of replicas per database: the holder of the leader lease
(key ``projector``) projects, the others stand by with their fold kept at the stored position and take
over about one lease TTL after it dies; the position row fences a deposed one (``projection.standby``).
``/healthz``'s ``leader`` and ``rally_leader`` say which one projects. An event PostgreSQL refuses is
quarantined, not retried: ``/healthz`` says degraded and names it, ``/metrics`` counts it. See
docs/projector.md.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from rallypoint.projection import DEFAULT_NAME, Projector, QuarantineCollector
from rallypoint.projection.standby import project_while_elected
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
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=3.0,
        help="leader lease TTL in seconds: a killed projector's standby takes over after about this long "
        "(the rally-leader bucket's TTL wins once it exists; default %(default)s)",
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
        # One lease for every projector on this NATS: the key is the role's (its NATS user may write
        # only that key), so run one projector deployment per cluster, with as many replicas as you like.
        lease = await ctx.leader_lease(key="projector", ttl=args.lease_ttl)
        await project_while_elected(projector, lease, ctx.stop)
        return 0

    return run_service(run, config)


if __name__ == "__main__":
    raise SystemExit(main())
