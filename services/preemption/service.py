"""`rally serve preemption`: follows every eviction the scheduler requests to its end.

It writes nothing, so it needs no lease nor fence. N replicas split the reports by job: the jobs fall
into 32 partitions (the job controller's hash) shared by the live replicas through their presence keys in
KV rally-partitions (``runtime.partitions.WorkShare``: rendezvous hashing, no leases, no epochs); a
killed replica's evictions are reported by the others about one ``--partition-ttl`` later."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rallypoint.control.reconcile import PREEMPTION_GRACE_S
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.cohost import Hosted
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower
from rallypoint.runtime.partitioned import add_partition_args, share_work

from .loop import HANDOVER_S, PARTITIONS, ROLE, EvictionWatch


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(*prepare(argv))


def prepare(argv: Sequence[str] | None = None) -> Hosted:
    """The service's main coroutine and configuration from its arguments: run alone (``main``) or
    hosted with others in one process (``rally serve host``, ``runtime.cohost``)."""
    parser = argparse.ArgumentParser(prog="rally serve preemption", description=__doc__)
    add_common_args(parser)
    add_partition_args(parser)
    parser.add_argument(
        "--grace",
        type=float,
        default=PREEMPTION_GRACE_S,
        help="the job controller's preemption grace period: an eviction is reported overdue after it",
    )
    # It no longer runs the policy; deployments (and `rally up` with a queue file) may still pass these.
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--queues", help=argparse.SUPPRESS)
    parser.add_argument("--lease-ttl", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("preemption", args)

    async def run(ctx: ServiceContext) -> int:
        async def work(follower: Follower) -> None:
            share = await share_work(ctx, service=ROLE, count=PARTITIONS, ttl=args.partition_ttl)
            # remember others' ended evictions a few TTLs: a killed replica's share moves after one
            handover = max(HANDOVER_S, 4 * share.membership.ttl)
            watch = EvictionWatch(follower, grace_s=args.grace, owns=share.owns, handover_s=handover)
            await watch.run(ctx.stop)

        return await with_follower(ctx, work)

    return run, config
