"""`rally serve job-controller`: launches bound gangs, collects exits, cancels. Run as many as you like: the
live replicas share the jobs' partitions, and a killed one's are taken by the others within seconds."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rallypoint.control import RecoveryConfig
from rallypoint.control.drain_flags import add_drain_policy_args, drain_policy_from_args
from rallypoint.events import subjects
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.cohost import Hosted
from rallypoint.runtime.following import open_follower
from rallypoint.runtime.partitioned import add_partition_args, share_partitions

from .controller import SOURCE, JobController


def _add_recovery_args(parser: argparse.ArgumentParser) -> None:
    defaults = RecoveryConfig()
    parser.add_argument(
        "--checkpoint-root",
        default=defaults.checkpoint_root,
        help="shared folder holding one checkpoint folder per job (RALLY_CHECKPOINT_DIR = ROOT/<job id>)",
    )
    parser.add_argument(
        "--retry-backoff",
        type=float,
        default=defaults.retry_backoff_s,
        help="seconds before the first retry of a failed attempt; doubles with each failure",
    )
    parser.add_argument(
        "--max-backoff", type=float, default=defaults.max_backoff_s, help="longest retry backoff, seconds"
    )
    parser.add_argument(
        "--max-infra-retries",
        type=int,
        default=defaults.max_infra_retries,
        help="infrastructure failures one job survives before it fails (they never use max_retries)",
    )
    parser.add_argument(
        "--failure-grace",
        type=float,
        default=defaults.failure_grace_s,
        help="seconds the surviving ranks of a failed attempt get between SIGTERM and SIGKILL",
    )
    add_drain_policy_args(parser)


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(*prepare(argv))


def prepare(argv: Sequence[str] | None = None) -> Hosted:
    """The service's main coroutine and configuration from its arguments: run alone (``main``) or
    hosted with others in one process (``rally serve host``, ``runtime.cohost``)."""
    parser = argparse.ArgumentParser(prog="rally serve job-controller", description=__doc__)
    add_common_args(parser)
    add_partition_args(parser)
    parser.add_argument("--command-timeout", type=float, default=5.0, help="seconds to wait for an agent")
    parser.add_argument(
        "--preemption-grace",
        type=float,
        default=30.0,
        help="seconds a preempted rank gets after SIGTERM to checkpoint (default 30)",
    )
    _add_recovery_args(parser)
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("job-controller", args)
    recovery = RecoveryConfig(
        checkpoint_root=args.checkpoint_root,
        retry_backoff_s=args.retry_backoff,
        max_backoff_s=args.max_backoff,
        max_infra_retries=args.max_infra_retries,
        failure_grace_s=args.failure_grace,
        drain=drain_policy_from_args(args),
    )

    async def run(ctx: ServiceContext) -> int:
        follower = await open_follower(ctx)
        log = await ctx.event_log()  # our own connection and NATS user, even when the fold is shared
        partitions = await share_partitions(
            ctx,
            log,
            follower,
            service=subjects.CONTROL_ROLE,
            count=subjects.CONTROL_PARTITIONS,
            source=SOURCE,
            ttl=args.partition_ttl,
        )
        controller = JobController(
            await ctx.nats(),
            log,
            follower,
            partitions=partitions,
            command_timeout=args.command_timeout,
            preemption_grace_s=args.preemption_grace,
            recovery=recovery,
        )
        await controller.run(ctx.stop)
        return 0

    return run, config
