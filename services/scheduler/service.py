"""`rally serve scheduler`: one active leader, any number of warm standbys."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rallypoint.observability import ClusterCollector
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.following import open_follower
from rallypoint.runtime.leadership import lead_while_elected
from rallypoint.runtime.metrics import add_collector
from rallypoint.scheduling import SchedulingPolicy, load_queue_config
from rallypoint.scheduling.repair import REPAIR_WAIT_S

from .heap import settle_heap
from .leader import MIN_CYCLE_GAP_S, SchedulerLoop


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rally serve scheduler", description=__doc__)
    add_common_args(parser)
    parser.add_argument("--policy", default="rallypoint", help="core policy name (default: rallypoint)")
    parser.add_argument("--queues", default=None, help="queue and quota configuration (JSON or YAML)")
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="leader lease TTL in seconds")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between cycles when nothing happens")
    parser.add_argument(
        "--min-cycle-gap",
        type=float,
        default=MIN_CYCLE_GAP_S,
        help="least seconds from one cycle's start to the next's while changes keep coming: what arrives "
        f"meanwhile is decided together (default {MIN_CYCLE_GAP_S}; 0: a cycle per change)",
    )
    parser.add_argument(
        "--repair-wait",
        type=float,
        default=REPAIR_WAIT_S,
        help="seconds an interrupted gang keeps its healthy nodes while no replacement node is free "
        f"(then an elastic gang shrinks, any other is requeued; default {REPAIR_WAIT_S:.0f})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = ServiceConfig.from_args("scheduler", args)
    queues, classes = load_queue_config(args.queues)
    policy = SchedulingPolicy(args.policy, queues=queues, priority_classes=classes)

    async def run(ctx: ServiceContext) -> int:
        follower = await open_follower(ctx)
        settle_heap()  # the caught-up fold: frozen out of the collector's full scans
        # The cluster's gauges, computed from this fold at each scrape (docs/observability.md).
        add_collector(ctx, ClusterCollector(lambda: follower.state, policy.queues))
        lease = await ctx.leader_lease(ttl=args.lease_ttl)
        loop = SchedulerLoop(
            follower.log,
            follower,
            instance=config.instance,
            policy=policy,
            tick_s=args.tick,
            min_cycle_gap_s=args.min_cycle_gap,
            repair_wait_s=args.repair_wait,
            queue_file=args.queues,
            tidy_heap=True,
        )
        loop.warm_up()
        await lead_while_elected(loop, lease, ctx.stop, pacing=ctx.read_pacing)
        return 0

    return run_service(run, config)
