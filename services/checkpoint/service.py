"""`rally serve checkpoint`: verifies committed checkpoints and applies the retention policy.

Every committed step is re-read (manifest and every shard) and recorded ``CheckpointVerified``; corrupt
steps and steps older than the newest ``--keep`` complete ones are removed and recorded
``CheckpointDeleted``, never the newest complete one. Decisions: ``rallypoint.checkpoints``.

Run as many as the verification I/O needs: the live replicas share the jobs' partitions
(``subjects.CHECKPOINT_PARTITIONS``, the job controller's hash; ``runtime.partitions``), each verifying and
removing the checkpoints of its own jobs alone, every append fenced by its partition's epoch; a killed
replica's jobs are taken by the others within about the partition TTL, with their pending work.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from rallypoint.checkpoints import DEFAULT_KEEP, RetentionPolicy
from rallypoint.ckpt import verify_checkpoint
from rallypoint.events import subjects
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.cohost import Hosted
from rallypoint.runtime.following import open_follower
from rallypoint.runtime.partitioned import add_partition_args, share_partitions

from .actions import SOURCE, CheckpointActions
from .keeper import CheckpointKeeper

_log = logging.getLogger("rallypoint.checkpoint")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 (the newest complete checkpoint is always kept)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(*prepare(argv))


def prepare(argv: Sequence[str] | None = None) -> Hosted:
    """The service's main coroutine and configuration from its arguments: run alone (``main``) or
    hosted with others in one process (``rally serve host``, ``runtime.cohost``)."""
    parser = argparse.ArgumentParser(prog="rally serve checkpoint", description=__doc__)
    add_common_args(parser)
    add_partition_args(parser)
    parser.add_argument(
        "--keep",
        type=_positive,
        default=DEFAULT_KEEP,
        help=f"complete checkpoints kept per job, the newest ones (default {DEFAULT_KEEP})",
    )
    parser.add_argument(
        "--max-parallel", type=_positive, default=2, help="checkpoints verified at once (default 2)"
    )
    parser.add_argument("--tick", type=float, default=5.0, help="seconds between retries of failed work")
    parser.add_argument("--sweep", type=float, default=60.0, help="seconds between full passes over all jobs")
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("checkpoint", args)

    async def run(ctx: ServiceContext) -> int:
        follower = await open_follower(ctx)
        # Writes on our own connection, as our own NATS user: the fold may be another service's
        # (``rally serve host``), and its connection may not write our subjects.
        log = await ctx.event_log()
        partitions = await share_partitions(
            ctx,
            log,
            follower,
            service=subjects.CHECKPOINT_ROLE,
            count=subjects.CHECKPOINT_PARTITIONS,
            source=SOURCE,
            ttl=args.partition_ttl,
        )
        _log.info("verifying commits; keeping the newest %d complete checkpoints per job", args.keep)
        actions = CheckpointActions(
            log, follower, verify_checkpoint, max_parallel=args.max_parallel, partitions=partitions
        )
        keeper = CheckpointKeeper(
            log,
            follower,
            actions,
            policy=RetentionPolicy(keep=args.keep),
            tick_s=args.tick,
            sweep_s=args.sweep,
            partitions=partitions,
        )
        await keeper.run(ctx.stop)
        return 0

    return run, config
