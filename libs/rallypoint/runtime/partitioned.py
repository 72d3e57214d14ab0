"""A partitioned service's share of its partitions (``runtime.partitions``), wired into its process: the
``--partition-ttl`` flag, the claim loop until the service stops, a clean hand-over at a clean stop, and
the ``rally_partitions_owned`` / ``rally_partition_members`` gauges. ``share_partitions`` for a service
that writes (leases, fenced epochs), ``share_work`` for one that writes nothing (membership alone)."""

from __future__ import annotations

import argparse

from rallypoint.eventlog import EventLog

from .follower import Follower
from .metrics import add_collector
from .partitions import PARTITION_TTL_S, PartitionOwnership, PartitionsCollector, WorkShare, member_name
from .service import ServiceContext


def add_partition_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partition-ttl",
        type=float,
        default=PARTITION_TTL_S,
        help="seconds a killed replica keeps its partitions before the others take them "
        "(the bucket's TTL wins once it exists)",
    )


async def share_partitions(
    ctx: ServiceContext,
    log: EventLog,
    follower: Follower,
    *,
    service: str,
    count: int,
    source: str,
    ttl: float,
) -> PartitionOwnership:
    """This replica's share of ``service``'s partitions, kept until the service stops."""
    partitions = await PartitionOwnership.open(
        await ctx.lease_jetstream(),
        log,
        follower,
        service=service,
        member=member_name(ctx.config.instance),
        count=count,
        source=source,
        ttl=ttl,
    )
    # Registered after the connection's drain, so it runs before it (LIFO): hand over while connected.
    ctx.stack.push_async_callback(partitions.resign)
    partitions.start(ctx.stop)
    add_collector(ctx, PartitionsCollector(partitions))
    return partitions


async def share_work(ctx: ServiceContext, *, service: str, count: int, ttl: float) -> WorkShare:
    """This replica's unfenced share of ``service``'s partitions, kept until the service stops."""
    share = await WorkShare.open(
        await ctx.lease_jetstream(),
        service=service,
        member=member_name(ctx.config.instance),
        count=count,
        ttl=ttl,
    )
    ctx.stack.push_async_callback(share.resign)  # before the connection's drain (LIFO): leave while connected
    share.start(ctx.stop)
    add_collector(ctx, PartitionsCollector(share))
    return share
