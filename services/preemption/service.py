"""`rally serve preemption`: picks victims with the core and requests their graceful stop. Leader-elected."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower
from rallypoint.runtime.leadership import lead_while_elected
from rallypoint.scheduling import SchedulingPolicy, load_queue_config

from .loop import PreemptionLoop


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rally serve preemption", description=__doc__)
    add_common_args(parser)
    parser.add_argument(
        "--policy", default="rallypoint", help="core policy name (must match the scheduler's)"
    )
    parser.add_argument("--queues", default=None, help="queue and quota configuration (JSON or YAML)")
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="leader lease TTL in seconds")
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("preemption", args)
    queues, classes = load_queue_config(args.queues)
    policy = SchedulingPolicy(args.policy, queues=queues, priority_classes=classes)

    async def run(ctx: ServiceContext) -> int:
        lease = await ctx.leader_lease(ttl=args.lease_ttl)

        async def work(follower: Follower) -> None:
            loop = PreemptionLoop(follower.log, follower, instance=config.instance, policy=policy)
            await lead_while_elected(loop, lease, ctx.stop)

        return await with_follower(ctx, work)

    return run_service(run, config)
