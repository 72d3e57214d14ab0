"""The health monitor's loop: heartbeats in; node unreachable, lost, recovered and health events out.

Silence is evidence only while this monitor hears the bus (``rallypoint.health.liveness``): it holds every
silence verdict while disconnected or when most nodes fall silent at once, and gives every node a full
timeout after it hears again. /healthz says ``degraded`` while verdicts are held.

What the heartbeats say (GPU throttling, ECC, XID, NVLink, NIC links, the ranks' step times) is judged by
``rallypoint.health.judge`` with ``detection``'s thresholds and hysteresis; each change of a node's verdict
is a ``NodeHealthChanged`` carrying its evidence (docs/health.md).

Several monitors share the nodes: the nodes fall into ``subjects.HEALTH_PARTITIONS`` partitions (the same
hash as the job controller's node sweeps) that the live replicas own dynamically (``runtime.partitions``).
Every replica hears every heartbeat and judges every node, so its windows and silences are current when a
partition comes to it; it appends the verdicts of the nodes it owns only, each append fenced by the
partition's ownership epoch: a deposed owner's append is refused by the server and it drops the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import msgspec
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from rallypoint.eventlog import EventLogError
from rallypoint.eventlog.connection import subscribe_direct
from rallypoint.events import subjects
from rallypoint.health import Assessment, Decision, HealthPolicy, Hearing, assess
from rallypoint.health.judge import HealthJudge
from rallypoint.health.readlag import ReadLag
from rallypoint.observability.instruments import HEARTBEATS_RECEIVED
from rallypoint.protocol import Heartbeat
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import PartitionOwnership

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


class HealthMonitor:
    """One monitor replica: ``run`` hears the heartbeats and appends, once a ``tick_s``, the verdicts of
    the nodes it owns (every node when ``partitions`` is None: one monitor, unfenced appends)."""

    def __init__(
        self,
        nc: Client,
        follower: Follower,
        policy: HealthPolicy,
        judge: HealthJudge,
        *,
        partitions: PartitionOwnership | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.nc = nc
        self.follower = follower
        self.policy = policy
        self.judge = judge
        self.partitions = partitions
        self.tick_s = tick_s
        self.last_seen: dict[str, float] = {}
        self.ears = Ears(nc, time.time())
        self._decode = msgspec.json.Decoder(Heartbeat).decode
        # 2,500 heartbeats a second at scale: the counters' children are looked up once, not per beat
        self._received = HEARTBEATS_RECEIVED.labels(result="ok")
        self._undecodable = HEARTBEATS_RECEIVED.labels(result="undecodable")
        self._woken = asyncio.Event()
        if partitions is not None:
            partitions.listeners.append(self._woken.set)  # a gained partition is judged at once

    def hear(self, subject: bytes, data: bytes) -> None:
        """One heartbeat, as the connection parsed it (``subscribe_direct``: 2,500 a second at scale)."""
        try:
            beat = self._decode(data)
        except msgspec.DecodeError:
            self._undecodable.inc()
            _log.warning("undecodable heartbeat on %s", subject.decode(errors="replace"))
            return
        self._received.inc()
        heard_at = time.time()
        self.last_seen[beat.node_id] = heard_at
        self.ears.lag.note(beat.node_id, beat.at, heard_at)
        self.judge.heard(beat)

    async def run(self, stop: asyncio.Event) -> None:
        sub: Subscription = await subscribe_direct(self.nc, subjects.HEARTBEATS, self.hear)
        try:
            while not stop.is_set():
                await self.assess_once(time.time())
                self._woken.clear()
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._woken.wait())]
                await asyncio.wait(waits, timeout=self.tick_s, return_when=asyncio.FIRST_COMPLETED)
                for waiting in waits:
                    waiting.cancel()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def assess_once(self, now: float) -> None:
        """Judge every node (silence over the whole cluster, so a mass silence is seen as one) and append
        the verdicts of the nodes owned now."""
        nodes = list(self.follower.state.nodes.values())
        assessment = assess(nodes, self.last_seen, now, self.policy, hearing=self.ears.hearing(now))
        self.ears.heard(assessment, now)
        await self._record(self._ours(assessment.decisions))
        await self._record(self._ours(_judged(self.judge, self.follower, now)))

    def _ours(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        if self.partitions is None:
            return tuple(decisions)
        return tuple(d for d in decisions if self.partitions.owns(d.node_id))

    async def _append(self, d: Decision) -> int:
        """Append one decision; fenced by the epoch of its node's partition when the nodes are shared:
        ``NotOwner`` when it is not ours now, ``AppendConflict`` (and the partition dropped) when a newer
        owner's epoch is stored."""
        subject = subjects.for_event(d.event)
        if self.partitions is None:
            return await self.follower.log.append(subject, d.event, msg_id=d.msg_id, source=SOURCE)
        return await self.partitions.append(d.node_id, subject, d.event, d.msg_id)

    async def _record(self, decisions: Sequence[Decision]) -> None:
        """Append one assessment's decisions together and wait for the fold once.

        Decisions about different nodes are independent (each has its own subject and message id), so they
        go out pipelined, at most ``APPENDS_IN_FLIGHT`` nodes at once, instead of one round trip and one
        fold wait each: 2,500 nodes falling silent together are flagged together, not one after another
        over 20 s. One node's decisions keep their order. A decision that failed is decided again by the
        next assessment (the fold has not moved) and appended with the same message id.
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
                        seq = await self._append(d)
                    except (EventLogError, TimeoutError) as exc:
                        _log.warning("could not record %s: %s", type(d.event).__name__, exc)
                        break  # the rest of this node's decisions wait for the next assessment
            return seq

        stored = await asyncio.gather(*(append(group) for group in by_node.values()))
        if any(stored):
            try:
                await self.follower.wait_for(max(stored))
            except TimeoutError as exc:
                _log.warning("the fold did not reach our %d decisions in time: %s", len(decisions), exc)


def _judged(judge: HealthJudge, follower: Follower, now: float) -> tuple[Decision, ...]:
    """The signal judge's decisions; a fault in it is logged loudly and the silence verdicts go on."""
    try:
        return tuple(judge.judge(follower.state.nodes, now))
    except Exception:
        _log.exception("the health judge failed; node health verdicts wait for the next pass")
        return ()
