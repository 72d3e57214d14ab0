"""`rally serve health-monitor`: heartbeats in; node unreachable, lost, recovered and health events out.

Silence is evidence only while this monitor hears the bus (``rallypoint.health.liveness``): it holds every
silence verdict while disconnected or when most nodes fall silent at once, and gives every node a full
timeout after it hears again. /healthz says ``degraded`` while verdicts are held.

What the heartbeats say (GPU throttling, ECC, XID, NVLink, NIC links, the ranks' step times) is judged by
``rallypoint.health.judge`` with ``detection``'s thresholds and hysteresis (``--detection-policy`` changes
them); each change of a node's verdict is a ``NodeHealthChanged`` carrying its evidence (docs/health.md).

Run as many as you like: the live replicas share the nodes' partitions, each appending the verdicts of its
own nodes, fenced; a killed one's nodes are judged by the others within about two seconds (``monitor``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import msgspec

from rallypoint.events import subjects
from rallypoint.health import HealthPolicy
from rallypoint.health.detection import DetectionPolicy
from rallypoint.health.judge import HealthJudge
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower
from rallypoint.runtime.health import add_health_check
from rallypoint.runtime.partitioned import add_partition_args, share_partitions

from .monitor import SOURCE, HealthMonitor


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rally serve health-monitor", description=__doc__)
    add_common_args(parser)
    add_partition_args(parser)
    parser.add_argument(
        "--unreachable-after", type=float, default=5.0, help="seconds of silence: unreachable"
    )
    parser.add_argument("--lost-after", type=float, default=30.0, help="seconds of silence: lost")
    parser.add_argument(
        "--detection-policy",
        type=_detection_policy,
        default=DetectionPolicy(),
        metavar="FILE",
        help="JSON object of DetectionPolicy fields to change (thresholds and windows; docs/health.md)",
    )
    parser.add_argument(
        "--max-temperature",
        type=float,
        default=None,
        help="GPU temperature counted as throttled, C (default: the detection policy's, 90)",
    )
    parser.add_argument(
        "--nic-speed",
        action="append",
        default=[],
        metavar="PORT=GBPS",
        help="the speed a port should negotiate (default: the fastest this monitor has seen it at)",
    )
    parser.add_argument(
        "--mass-silence-fraction",
        type=float,
        default=0.5,
        help="more than this fraction of the nodes silent at once: suspect this monitor, hold verdicts",
    )
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("health-monitor", args)
    policy = HealthPolicy(
        unreachable_after_s=args.unreachable_after,
        lost_after_s=args.lost_after,
        mass_silence_fraction=args.mass_silence_fraction,
    )

    detection: DetectionPolicy = args.detection_policy
    if args.max_temperature is not None:
        detection = msgspec.structs.replace(detection, hot_temperature_c=args.max_temperature)
    nic_speeds = _nic_speeds(parser, args.nic_speed)

    async def run(ctx: ServiceContext) -> int:
        async def watch(follower: Follower) -> None:
            partitions = await share_partitions(
                ctx,
                follower.log,
                follower,
                service=subjects.HEALTH_ROLE,
                count=subjects.HEALTH_PARTITIONS,
                source=SOURCE,
                ttl=args.partition_ttl,
            )
            judge = HealthJudge(detection, nic_speed_gbps=nic_speeds)
            monitor = HealthMonitor(await ctx.nats(), follower, policy, judge, partitions=partitions)
            add_health_check(ctx, monitor.ears.health, degraded=True)
            await monitor.run(ctx.stop)

        # The nodes' events are all this monitor reads of the log (its partitions' epochs among them): a
        # job's many events are not its business, and folding them cost it CPU beside the heartbeats at
        # every burst of jobs.
        return await with_follower(ctx, watch, subjects=subjects.NODES)

    return run_service(run, config)


def _detection_policy(path: str) -> DetectionPolicy:
    try:
        with open(path, "rb") as f:
            return msgspec.json.decode(f.read(), type=DetectionPolicy)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"detection policy {path}: {exc}") from exc


def _nic_speeds(parser: argparse.ArgumentParser, entries: list[str]) -> dict[str, float]:
    speeds: dict[str, float] = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        try:
            speeds[name.strip()] = float(value)
        except ValueError:
            parser.error(f"--nic-speed {entry!r}: expected PORT=GBPS, e.g. ib0=400")
    return speeds
