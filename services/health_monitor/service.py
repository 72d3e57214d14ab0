"""`rally serve health-monitor`: heartbeats in; node unreachable, lost, recovered and health events out.

Silence is evidence only while this monitor hears the bus (``rallypoint.health.liveness``): it holds every
silence verdict while disconnected or when most nodes fall silent at once, and gives every node a full
timeout after it hears again. /healthz says ``degraded`` while verdicts are held.

What the heartbeats say (GPU throttling, ECC, XID, NVLink, NIC links, the ranks' step times) is judged by
``rallypoint.health.judge`` with ``detection``'s thresholds and hysteresis (``--detection-policy`` changes
them); each change of a node's verdict is a ``NodeHealthChanged`` carrying its evidence (docs/health.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from rallypoint.eventlog import EventLogError
from rallypoint.events import subjects
from rallypoint.health import Assessment, Decision, HealthPolicy, Hearing, assess
from rallypoint.health.detection import DetectionPolicy
from rallypoint.health.judge import HealthJudge
from rallypoint.health.readlag import ReadLag
from rallypoint.observability.instruments import HEARTBEATS_RECEIVED
from rallypoint.protocol import Heartbeat
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import with_follower
from rallypoint.runtime.health import add_health_check

_log = logging.getLogger("rallypoint.health_monitor")
SOURCE = "rallypoint/health-monitor"
#: While verdicts are held, say so again this often (an operator must not miss a long hold).
HOLD_REMINDER_S = 10.0
#: Reading the heartbeats this late (seconds, beyond each node's usual delay): warned, and /healthz degraded.
BEHIND_WARN_S = 1.0
#: Decisions of one assessment appended at once: enough to hide the round trip, bounded for the server.
APPENDS_IN_FLIGHT = 512


class Ears:
    """What this monitor knows of its own link: connected or not, since when it hears without a break
    (its start, its last reconnect, the end of its last hold), and how far behind it reads the heartbeats
    (``lag``, noted by the heartbeat handler). Logs every change loudly."""

    def __init__(self, nc: Client, now: float) -> None:
        self.nc = nc
        self.since = now
        self.held = ""
        self.lag = ReadLag()
        self.behind_s = 0.0
        self._reconnects = self._reconnect_count()
        self._reminded = now
        self._lag_reminded = now

    def _reconnect_count(self) -> int:
        return int(self.nc.stats.get("reconnects", 0))

    def hearing(self, now: float) -> Hearing:
        reconnects = self._reconnect_count()
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self.since = now
            _log.warning("reconnected to NATS: every node gets a full timeout from now before any verdict")
        self._note_behind(self.lag.behind_s(), now)
        return Hearing(connected=self.nc.is_connected, since=self.since, behind_s=self.behind_s)

    def _note_behind(self, behind_s: float, now: float) -> None:
        """Say so when this monitor starts reading the heartbeats late, every few seconds while it does,
        and when it has caught up: its verdicts are that much later meanwhile."""
        late, was_late = behind_s >= BEHIND_WARN_S, self.behind_s >= BEHIND_WARN_S
        if late and (not was_late or now - self._lag_reminded >= HOLD_REMINDER_S):
            _log.warning("reading heartbeats %.1f s late: silence is judged as of then", behind_s)
            self._lag_reminded = now
        elif was_late and not late:
            _log.warning("heartbeats read on time again (%.1f s late)", behind_s)
        self.behind_s = behind_s

    def heard(self, assessment: Assessment, now: float) -> None:
        """Record the hold (or its end) an assessment reports; while one lasts, remind every few seconds."""
        remind = now - self._reminded >= HOLD_REMINDER_S
        if assessment.held and (not self.held or remind):
            _log.error("holding every node verdict: %s", assessment.held)
            self._reminded = now
        elif self.held and not assessment.held:
            self.since = now
            _log.warning("verdicts resume; every node gets a full timeout from now (was: %s)", self.held)
        mass = assessment.mass
        if mass is not None and not assessment.held and remind:
            _log.error(
                "%d of %d nodes silent for %.0f s, past the hold limit: believing them",
                mass.quiet,
                mass.watched,
                now - mass.first,
            )
            self._reminded = now
        self.held = assessment.held

    def health(self) -> list[str]:
        problems = [f"node verdicts held: {self.held}"] if self.held else []
        if self.behind_s >= BEHIND_WARN_S:
            problems.append(f"reading heartbeats {self.behind_s:.1f} s late: silence judged that much later")
        return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rally serve health-monitor", description=__doc__)
    add_common_args(parser)
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
        nc = await ctx.nats()
        last_seen: dict[str, float] = {}
        judge = HealthJudge(detection, nic_speed_gbps=nic_speeds)
        decode = msgspec.json.Decoder(Heartbeat).decode
        ears = Ears(nc, time.time())
        add_health_check(ctx, ears.health, degraded=True)
        # 2,500 heartbeats a second at scale: the counters' children are looked up once, not per beat
        received = HEARTBEATS_RECEIVED.labels(result="ok")
        undecodable = HEARTBEATS_RECEIVED.labels(result="undecodable")

        async def on_heartbeat(msg: Msg) -> None:
            try:
                beat = decode(msg.data)
            except msgspec.DecodeError:
                undecodable.inc()
                _log.warning("undecodable heartbeat on %s", msg.subject)
                return
            received.inc()
            heard_at = time.time()
            last_seen[beat.node_id] = heard_at
            ears.lag.note(beat.node_id, beat.at, heard_at)
            judge.heard(beat)

        async def watch(follower: Follower) -> None:
            await nc.subscribe(subjects.HEARTBEATS, cb=on_heartbeat)
            while not ctx.stopping:
                now = time.time()
                nodes = list(follower.state.nodes.values())
                assessment = assess(nodes, last_seen, now, policy, hearing=ears.hearing(now))
                ears.heard(assessment, now)
                await _record(follower, assessment.decisions)
                await _record(follower, _judged(judge, follower, now))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.stop.wait(), 1.0)

        # The nodes' events are all this monitor reads of the log: a job's many events are not its
        # business, and folding them cost it CPU beside the heartbeats at every burst of jobs.
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


def _judged(judge: HealthJudge, follower: Follower, now: float) -> tuple[Decision, ...]:
    """The signal judge's decisions; a fault in it is logged loudly and the silence verdicts go on."""
    try:
        return tuple(judge.judge(follower.state.nodes, now))
    except Exception:
        _log.exception("the health judge failed; node health verdicts wait for the next pass")
        return ()


async def _record(follower: Follower, decisions: Sequence[Decision]) -> None:
    """Append one assessment's decisions together and wait for the fold once.

    Decisions about different nodes are independent (each has its own subject and message id), so they go
    out pipelined, at most ``APPENDS_IN_FLIGHT`` nodes at once, instead of one round trip and one fold
    wait each: 2,500 nodes falling silent together are flagged together, not one after another over
    20 s. One node's decisions keep their order. A decision that failed is decided again by the next
    assessment (the fold has not moved) and appended with the same message id.
    """
    by_node: dict[str, list[Decision]] = {}
    for decision in decisions:
        by_node.setdefault(decision.node_id, []).append(decision)
    gate = asyncio.Semaphore(APPENDS_IN_FLIGHT)

    async def append(decisions: list[Decision]) -> int:
        seq = 0
        async with gate:
            for d in decisions:
                try:
                    seq = await follower.log.append(
                        subjects.for_event(d.event), d.event, msg_id=d.msg_id, source=SOURCE
                    )
                except (EventLogError, TimeoutError) as exc:
                    _log.warning("could not record %s: %s", type(d.event).__name__, exc)
                    break  # the rest of this node's decisions wait for the next assessment
        return seq

    stored = await asyncio.gather(*(append(group) for group in by_node.values()))
    if any(stored):
        try:
            await follower.wait_for(max(stored))
        except TimeoutError as exc:
            _log.warning("the fold did not reach our %d decisions in time: %s", len(decisions), exc)
