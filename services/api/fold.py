"""The API's read model: the runtime's ``Follower`` (a ``ClusterState`` at the log's tip), run in the
background with what an HTTP front end needs around it.

Handlers read ``fold.state`` directly (one event loop, no locks needed). A write is answered once the
log acknowledged it and noted with ``wrote``; a read first waits (``wait_current``) until the initial
replay is done (answers from half a log would be wrong) and the fold holds every write the log had
acknowledged when the read began, whichever replica made it (``readindex``), so a client that gets 202
from one API replica and immediately asks another for its job finds it. If following
fails (server restart, gap) the loop resumes from the last folded sequence: the fold is a pure function
of the log, so continuing from where it stopped is correct.
A message the fold cannot read is quarantined like in every other service (``Follower``): it never
stops the fold, and a newer event version among them makes the API report itself degraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from typing import get_args

from rallypoint.eventlog import EventLog, SnapshotStore
from rallypoint.events.codec import QuarantineReason
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import save_periodically
from rallypoint.state import ClusterState

from .readindex import ReadIndex, stream_tip

_log = logging.getLogger("rallypoint.api.fold")

QUARANTINE_REASONS: tuple[str, ...] = get_args(QuarantineReason)
RETRY_DELAY_S = 1.0
STOP_TIMEOUT_S = 5.0
#: Allocations between two young collections once the fold has caught up (the interpreter's default: 700).
YOUNG_GC_THRESHOLD = 50_000


def settle_heap() -> None:
    """Freeze the caught-up fold out of the cyclic collector, and collect young objects less often.

    The fold is tens of thousands of long-lived objects (a view per node, per job and per GPU) in which
    the collector never finds garbage, and with the default thresholds every request's allocations
    brought a young collection every couple of submissions and, every few thousand submissions, a full
    collection of that whole heap: ~140 ms with 12,500 nodes, during which all 16 requests in flight
    waited. The scheduler settles its heap the same way (services/scheduler/heap.py); cyclic garbage is
    still collected, only later, and what the fold adds after this is collected as before.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


class Replaying(Exception):
    """The initial replay had not finished within the wait: answers from half a log would be wrong."""


class NotVisible(Exception):
    """The fold had not reached what a read must see (``target``) within the wait; it was at ``at``."""

    def __init__(self, target: int, at: int) -> None:
        super().__init__(f"the fold is at seq {at}, the read needs seq {target}")
        self.target = target
        self.at = at


class FoldFollower:
    def __init__(
        self, log: EventLog, snapshots: SnapshotStore | None = None, *, settle: bool = False
    ) -> None:
        self.follower = Follower(log)
        self.snapshots = snapshots
        # settle_heap once caught up: the process's collector is changed, so only `rally serve api` asks
        # (an in-process test must not freeze the test runner's heap).
        self.settle = settle
        self.caught_up = asyncio.Event()  # set once the initial replay reached the log's end
        self.written = 0  # the highest sequence an append of this instance was acknowledged at
        self.following = False
        self.failures = 0
        # Where the log ends, asked of the server before a read (concurrent reads share the question).
        self.read_index = ReadIndex(stream_tip(log, log.timeout))
        self._task: asyncio.Task[None] | None = None
        self._saver: asyncio.Task[None] | None = None  # saves the API's own snapshot once caught up

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="api-fold")

    async def stop(self) -> None:
        saver, self._saver = self._saver, None
        if saver is not None:
            saver.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Bounded: shutdown must never hang on a follow that does not honour cancellation promptly.
            done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if not done:
                _log.warning("the log follower did not stop within %.1fs of being cancelled", STOP_TIMEOUT_S)
                return
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.read_index.close()

    def degraded(self) -> list[str]:
        """Newer event versions in the log than this instance reads: it serves, but not all of the truth."""
        return self.follower.degraded()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        await self._restore()
        while True:
            try:
                await self.follower.catch_up()
                if not self.caught_up.is_set():
                    self._caught_up_first()
                self.following = True
                await self.follower.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Keep the last folded state while the log is away: writes fail on their own with
                # LogUnavailable, and reads with 503 until the log can tell them where it ends.
                self.following = False
                self.failures += 1
                _log.warning(
                    "following the log failed at seq %d: %s: %s; retrying",
                    self.state.last_seq,
                    type(exc).__name__,
                    exc,
                )
                await asyncio.sleep(RETRY_DELAY_S)

    async def _restore(self) -> None:
        if self.snapshots is None:
            return
        try:
            if await self.follower.restore(self.snapshots):
                _log.info("restored state at seq %d from snapshot", self.state.last_seq)
        except Exception as exc:  # a missing or unreadable snapshot only costs a longer replay
            _log.warning("no snapshot (%s); replaying from the start", exc)

    def _caught_up_first(self) -> None:
        """The initial replay is done: reads may be answered, and from here on the API saves its own
        snapshot (no other role's is its to restore) as every service that folds the whole log does."""
        if self.settle:
            settle_heap()
        if self.snapshots is not None:
            self._saver = asyncio.create_task(
                save_periodically(self.follower, self.snapshots), name="api-snapshots"
            )
        self.caught_up.set()

    # -- waiting ---------------------------------------------------------------------------------

    async def wait_for_seq(self, seq: int, timeout: float) -> bool:
        """Wait until the fold has applied stream sequence ``seq``; False if ``timeout`` ran out first."""
        if self.state.last_seq >= seq:
            return True
        try:
            await self.follower.wait_for(seq, timeout)
            return True
        except TimeoutError:
            return False

    def wrote(self, seq: int) -> None:
        """An append of this instance was acknowledged at ``seq``: reads wait until the fold holds it."""
        if seq > self.written:
            self.written = seq

    async def wait_replayed(self, timeout: float) -> bool:
        """Until the initial replay is done (what a submission needs: the cluster it is validated against);
        False if ``timeout`` ran out first."""
        if self.caught_up.is_set():
            return True
        try:
            await asyncio.wait_for(self.caught_up.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def wait_current(self, timeout: float) -> None:
        """Until the fold holds every write the log had acknowledged when this call began, by this
        instance or any other: what a read must wait for so that no replica answers 404 for a job
        another one accepted, or an old state after a cancel another one acknowledged.

        There is no cheaper test that is right: this instance's own writes (``written``) say nothing of
        another replica's, and an event not yet received looks the same as one never appended. So every
        read asks the log where it ends (one round trip, shared by the reads in flight: ``ReadIndex``).
        Raises Replaying, LogUnavailable (the log did not say) or NotVisible when ``timeout`` ran out.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not await self.wait_replayed(timeout):
            raise Replaying
        tip = await self.read_index.latest(max(0.0, deadline - loop.time()))
        # The tip already covers this instance's acknowledged writes; the max costs nothing and keeps
        # read-your-writes should a newly elected stream leader ever answer from behind.
        target = max(tip, self.written)
        if not await self.wait_for_seq(target, max(0.0, deadline - loop.time())):
            raise NotVisible(target, self.state.last_seq)

    async def wait_caught_up(self, timeout: float) -> bool:
        """Until the initial replay is done and the fold holds every append this instance had acknowledged;
        False if ``timeout`` ran out first. No round trip to the log, but only this instance's writes:
        HTTP reads wait with ``wait_current``, which implies this and covers the other replicas' too.

        A write is answered as soon as the log acknowledged it, without waiting for the fold: a wait there
        held each of the requests in flight for the fold to work through everything appended before it.
        """
        if self.caught_up.is_set() and self.state.last_seq >= self.written:
            return True
        deadline = asyncio.get_running_loop().time() + timeout
        if not await self.wait_replayed(timeout):
            return False
        remaining = deadline - asyncio.get_running_loop().time()
        return await self.wait_for_seq(self.written, max(0.0, remaining))


def quarantine_metrics(state: ClusterState) -> str:
    """Prometheus lines for the messages the fold quarantined, by reason (zeros included)."""
    lines = [
        "# HELP rally_events_quarantined_total Log messages the fold skipped: undecodable, unknown or newer.",
        "# TYPE rally_events_quarantined_total counter",
    ]
    for reason in QUARANTINE_REASONS:
        count = state.quarantine.by_reason.get(reason, 0)
        lines.append(f'rally_events_quarantined_total{{reason="{reason}"}} {count}')
    return "\n".join(lines) + "\n"
