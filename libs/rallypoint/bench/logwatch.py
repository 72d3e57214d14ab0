"""The scale harness's view of the log: every event with the time the server stored it.

Services stamp an event's ``at`` when they decide, not when the decision lands; what a user or the next
service sees is the stored time, so the harness reads it from the JetStream delivery (the reply subject
carries the stream sequence and the store timestamp in nanoseconds) and indexes what it measures:
first ``JobStarted`` / ``GangBound`` / ``JobCompleted`` / ``JobQueued`` / ``JobCancelled`` per job, first
``NodeHeartbeatLost`` / ``NodeLost`` per node, the scheduler's epochs, and per scheduling cycle (its
decisions share ``at``, the cycle's start) the first decision's store time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from rallypoint.eventlog.connection import FastHeadersClient
from rallypoint.eventlog.feeds import DirectFeed, FeedReset, ack_fields
from rallypoint.events import (
    GangBound,
    JobCancelled,
    JobCompleted,
    JobPending,
    JobQueued,
    JobStarted,
    LeaderEpochStarted,
    NodeHeartbeatLost,
    NodeLost,
)
from rallypoint.events.codec import decode
from rallypoint.events.subjects import members

STREAM = "RALLY"
#: How often the watchdog looks, and how long the reader may make no progress while the stream has more
#: before it is opened again (nats-py's ordered consumer was seen stalling for minutes on a loaded
#: three-server cluster, its own reset slow to come).
WATCHDOG_S = 1.0
STALL_S = 3.0


@dataclass
class LogWatch:
    """A live ordered consumer over the whole log, from ``from_seq``, indexing stored times."""

    nc: Client
    started: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    #: job -> the log position its GangBound was computed from
    bound_from: dict[str, int] = field(default_factory=dict)
    #: job -> the start of the cycle that bound it (its GangBound's ``at``)
    bound_cycle: dict[str, float] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)
    #: job -> store time of its first JobPending (a cycle considered it and found nowhere to place it)
    pending: dict[str, float] = field(default_factory=dict)
    cancelled: dict[str, float] = field(default_factory=dict)
    #: node -> store times of each of its NodeHeartbeatLost / NodeLost
    heartbeat_lost: dict[str, list[float]] = field(default_factory=dict)
    lost: dict[str, list[float]] = field(default_factory=dict)
    #: (stored time, leader id, epoch) of every scheduler LeaderEpochStarted
    epochs: list[tuple[float, str, int]] = field(default_factory=list)
    #: (stored time, role, leader id) of every partition owner's LeaderEpochStarted (``<service>.<p>``)
    partition_epochs: list[tuple[float, str, str]] = field(default_factory=list)
    #: a cycle's start (its decisions' ``at``) -> (store time of its first decision, the log position it
    #: was computed from)
    cycles: dict[float, tuple[float, int]] = field(default_factory=dict)
    #: stream sequence -> store time, of every event seen
    stored_at: dict[int, float] = field(default_factory=dict)
    events: int = 0
    last_seq: int = 0
    #: times the subscription skipped a sequence and was opened again after the last one seen
    resubscribed: int = 0
    #: of those, times it made no progress for ``STALL_S`` while the stream had more (``_watchdog``)
    stalled: int = 0
    _sub: object | None = None
    _feed: DirectFeed | None = None
    _reading: asyncio.Task[None] | None = None
    _reopening: asyncio.Task[None] | None = None
    _watching: asyncio.Task[None] | None = None

    async def start(self, from_seq: int = 1) -> None:
        await self._open(from_seq)
        if self._watching is None:
            self._watching = asyncio.create_task(self._watchdog())

    async def _open(self, from_seq: int) -> None:
        js = self.nc.jetstream()
        # every sequence in order or none: a skipped one (GUIDE: nats-py's ordered consumer may skip
        # silently; seen on a three-server cluster under load) would leave a job "never started" here
        self.last_seq = max(self.last_seq, from_seq - 1)
        if isinstance(self.nc, FastHeadersClient):
            # The services' own reader, off the connection without a nats-py message per event: the
            # harness's CPU is in the cluster bench's per-job sum, and this read was most of it.
            self._feed = DirectFeed(self.nc, js, STREAM)
            await self._feed.open("rally.>", max(1, from_seq))
            self._reading = asyncio.create_task(self._read(self._feed))
            return
        self._sub = await js.subscribe(
            "rally.>",
            stream=STREAM,
            cb=self._on_msg,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=max(1, from_seq)),
            idle_heartbeat=2.0,
            pending_msgs_limit=-1,
            pending_bytes_limit=512 * 1024 * 1024,
        )

    def _reopen(self) -> None:
        if self._reopening is None or self._reopening.done():
            self.resubscribed += 1
            self._reopening = asyncio.create_task(self._resubscribe())

    async def _resubscribe(self) -> None:
        await self._close()
        await self._open(self.last_seq + 1)

    async def _watchdog(self) -> None:
        """Open the subscription again when it makes no progress for ``STALL_S`` while the stream holds
        events past the last one read."""
        js = self.nc.jetstream()
        seen, since = self.last_seq, time.monotonic()
        while True:
            await asyncio.sleep(WATCHDOG_S)
            if self.last_seq != seen:
                seen, since = self.last_seq, time.monotonic()
                continue
            try:
                stored = (await js.stream_info(STREAM)).state.last_seq
            except (nats.errors.Error, TimeoutError):
                continue
            if stored > self.last_seq and time.monotonic() - since >= STALL_S:
                self.stalled += 1
                self._reopen()
                since = time.monotonic()

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            self._watching = None
        await self._close()

    async def _close(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None and reading is not asyncio.current_task():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.close()
        if self._sub is not None:
            await self._sub.unsubscribe()  # type: ignore[attr-defined]
            self._sub = None

    async def _read(self, feed: DirectFeed) -> None:
        """Take every delivery of ``feed`` until it loses its order (then it is opened again)."""
        while True:
            try:
                batch = await feed.batch(WATCHDOG_S)
            except TimeoutError:
                continue
            except FeedReset:
                self._reopen()
                return
            for delivery in batch:
                if not self._take(delivery.seq, delivery.stored_ns / 1e9, delivery.data):
                    return

    async def _on_msg(self, msg: Msg) -> None:
        found = ack_fields(msg.reply or "")
        if found is not None:
            self._take(found.stream_seq, found.stored_ns / 1e9, msg.data)

    def _take(self, seq: int, stored: float, data: bytes) -> bool:
        """Index the event stored at ``seq``; False when a sequence was skipped (the subscription is then
        opened again from the first one missed)."""
        if seq <= self.last_seq:
            return True  # redelivered after a reset
        if seq != self.last_seq + 1:
            self._reopen()
            return False
        self.last_seq = seq
        self.stored_at[seq] = stored
        self.events += 1
        try:
            event = decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return True
        for member in members(event):
            self._index(member, stored)
        return True

    def _index(self, event: object, stored: float) -> None:
        if isinstance(event, JobStarted):
            self.started.setdefault(event.job_id, stored)
        elif isinstance(event, GangBound):
            self.bound.setdefault(event.job_id, stored)
            self.bound_from.setdefault(event.job_id, event.computed_at_seq)
            self.bound_cycle.setdefault(event.job_id, event.at)
            self.cycles.setdefault(event.at, (stored, event.computed_at_seq))
        elif isinstance(event, JobPending):
            self.pending.setdefault(event.job_id, stored)
            self.cycles.setdefault(event.at, (stored, event.computed_at_seq))
        elif isinstance(event, JobCompleted):
            self.completed.setdefault(event.job_id, stored)
        elif isinstance(event, JobQueued):
            self.queued.setdefault(event.job_id, stored)
        elif isinstance(event, JobCancelled):
            self.cancelled.setdefault(event.job_id, stored)
        elif isinstance(event, NodeHeartbeatLost):
            self.heartbeat_lost.setdefault(event.node_id, []).append(stored)
        elif isinstance(event, NodeLost):
            self.lost.setdefault(event.node_id, []).append(stored)
        elif isinstance(event, LeaderEpochStarted) and event.role == "scheduler":
            self.epochs.append((stored, event.leader_id, event.epoch))
        elif isinstance(event, LeaderEpochStarted) and "." in event.role:
            self.partition_epochs.append((stored, event.role, event.leader_id))

    async def wait(self, done: Callable[[], bool], timeout: float, *, poll_s: float = 0.2) -> bool:
        """Until ``done()`` holds (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    @staticmethod
    def first_after(times: dict[str, list[float]], node_id: str, since: float) -> float | None:
        """The first of a node's store times at or after ``since``."""
        return next((t for t in times.get(node_id, ()) if t >= since), None)

    def binds_span(self, job_ids: list[str]) -> float | None:
        """Seconds from the moment the first of these binds could be decided (the store time of the
        position it was computed from) to the last one stored; None when none is bound. Robust to binds
        written as one atomic batch, which share one store time."""
        bound = [j for j in job_ids if j in self.bound]
        if not bound:
            return None
        first = min(self.bound_from[j] for j in bound)
        begin = min(self.stored_at.get(first, self.bound[bound[0]]), *(self.bound[j] for j in bound))
        return max(self.bound[j] for j in bound) - begin

    def cycle_ms(self, since: float, until: float, *, from_start: bool = False) -> list[float]:
        """For cycles started in [since, until], in ms: from the moment the state they decided on was in
        the log (the store time of ``computed_at_seq``; never before the cycle's start) to their first
        decision stored: the cycle's snapshot and decision, without the admissions and fold waits
        before it. ``from_start``: from the cycle's start, everything included."""
        out = []
        for at, (stored, computed_at) in self.cycles.items():
            if since <= at <= until:
                begin = at if from_start else max(at, self.stored_at.get(computed_at, at))
                out.append((stored - begin) * 1000)
        return out
