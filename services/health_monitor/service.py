"""`rally serve health-monitor`: heartbeats in; node lost, recovered and drained events out."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import msgspec
from nats.aio.msg import Msg

from rallypoint.eventlog import EventLogError
from rallypoint.events import subjects
from rallypoint.health import HealthPolicy, assess
from rallypoint.protocol import Heartbeat
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower

_log = logging.getLogger("rallypoint.health_monitor")
SOURCE = "rallypoint/health-monitor"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rally serve health-monitor", description=__doc__)
    add_common_args(parser)
    parser.add_argument(
        "--unreachable-after", type=float, default=5.0, help="seconds of silence: unreachable"
    )
    parser.add_argument("--lost-after", type=float, default=30.0, help="seconds of silence: lost")
    parser.add_argument("--max-temperature", type=float, default=90.0, help="GPU temperature that drains, C")
    args = parser.parse_args(argv)
    config = ServiceConfig.from_args("health-monitor", args)
    policy = HealthPolicy(
        unreachable_after_s=args.unreachable_after,
        lost_after_s=args.lost_after,
        max_temperature_c=args.max_temperature,
    )

    async def run(ctx: ServiceContext) -> int:
        nc = await ctx.nats()
        last_seen: dict[str, float] = {}
        last_beats: dict[str, Heartbeat] = {}
        decoder = msgspec.json.Decoder(Heartbeat)
        watching_since = time.time()

        async def on_heartbeat(msg: Msg) -> None:
            try:
                beat = decoder.decode(msg.data)
            except msgspec.DecodeError:
                _log.warning("undecodable heartbeat on %s", msg.subject)
                return
            last_seen[beat.node_id] = time.time()
            last_beats[beat.node_id] = beat

        async def watch(follower: Follower) -> None:
            await nc.subscribe(subjects.HEARTBEATS, cb=on_heartbeat)
            log = follower.log
            while not ctx.stopping:
                decisions = assess(
                    list(follower.state.nodes.values()),
                    last_beats,
                    last_seen,
                    time.time(),
                    policy,
                    watching_since=watching_since,
                )
                for decision in decisions:
                    try:
                        seq = await log.append(
                            subjects.node(decision.node_id),
                            decision.event,
                            msg_id=decision.msg_id,
                            source=SOURCE,
                        )
                        await follower.wait_for(seq)
                    except (EventLogError, TimeoutError) as exc:
                        _log.warning("could not record %s: %s", type(decision.event).__name__, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.stop.wait(), 1.0)

        return await with_follower(ctx, watch)

    return run_service(run, config)
