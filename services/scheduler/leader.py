"""The scheduler shell: follow the log, win the lease, fence older leaders, append the core's decisions.

No decision is made here: ``rallypoint.scheduling`` turns the folded state into a snapshot, the pure core
decides, and this loop only appends what it returns: the cycle's whole output (binds, preemption requests,
pending reasons) through this one fenced writer, so every decision of a cycle comes from one fold at one
``now`` (the preemption service re-runs nothing; it follows the evictions).

Safety does not rest on the lease: every write is conditional on the last sequence of the ``rally.sched.>``
tree, and a new leader bumps that tree with ``LeaderEpochStarted`` first, so a paused or partitioned old
leader's next write is refused by the server (``AppendConflict``) and it steps down. A cycle's writes go out
as fenced atomic batches (``FencedWriter.append_many``), so a deposed leader loses a whole batch, never half
of one. Before its first decision of an epoch the leader records the settings it decides with
(``SchedulerSettings``: policy, queues, repair wait), so an audit replays that epoch under them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from rallypoint.eventlog import EventLog
from rallypoint.events import SchedulerSettings, subjects
from rallypoint.observability import observe_writes
from rallypoint.observability.instruments import (
    SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS,
    SCHEDULER_CYCLE_SECONDS,
    SCHEDULER_CYCLES,
    SCHEDULER_EVENTS_WRITTEN,
    SCHEDULER_WRITE_SECONDS,
)
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy, Write
from rallypoint.scheduling.cycle import decide, writes_before_deciding
from rallypoint.scheduling.repair import REPAIR_WAIT_S, repair_writes
from rallypoint.state import ClusterState

from .heap import IdleTidy, collector_paused

_log = logging.getLogger("rallypoint.scheduler")

SOURCE = "rallypoint/scheduler"

#: Under a stream of changes, at most one cycle per this many seconds (``leadership.lead``): a cycle
#: costs the leader ~1 ms of CPU at 12,500 nodes whatever it binds, and every service folds its write.
#: 10 ms left submit-to-running as it was; 20 ms cost more latency than it saved (docs/architecture.md,
#: "Cycles under load").
MIN_CYCLE_GAP_S = 0.01


class SchedulerLoop:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        *,
        instance: str,
        policy: SchedulingPolicy,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
        min_cycle_gap_s: float = MIN_CYCLE_GAP_S,
        repair_wait_s: float = REPAIR_WAIT_S,
        queue_file: str | None = None,
        tidy_heap: bool = False,
    ) -> None:
        self.log = log
        self.follower = follower
        self.instance = instance
        self.policy = policy
        self.clock = clock
        self.tick_s = tick_s
        self.min_cycle_gap_s = min_cycle_gap_s
        self.repair_wait_s = repair_wait_s
        self.queue_file = queue_file
        self.writer = FencedWriter(
            log,
            follower,
            role="scheduler",
            tree=subjects.SCHEDULER_TREE,
            epoch_subject=subjects.EPOCH,
            instance=instance,
            source=SOURCE,
            clock=clock,
        )
        self.cycles = 0
        # What the fold touched since the model was last synced: each sync applies only that. Taken right
        # before a sync, never without one, so no change is lost between two syncs.
        self._changes = follower.changes()
        # The last sequence the cycles wrote. Their admissions ride off the fenced tree, after its last
        # event: the next cycle must see them folded too, or it would admit those jobs again, and an atomic
        # batch repeating a stored message id is refused whole (10201, taken for a newer leader's fence).
        self._written = 0
        # The service settles its heap and tidies it when idle (heap.py); an in-process test or bench
        # leaves the process's collector alone.
        self._tidy = IdleTidy() if tidy_heap else None
        # The epoch whose settings this leader has recorded (0: none yet).
        self._settings_epoch = 0

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def epoch(self) -> int:
        return self.writer.epoch

    async def start_epoch(self, term: int = 0) -> int:
        return await self.writer.start_epoch(term)

    def warm_up(self) -> None:
        """Build the model (and its index) from the fold as it is now, before leading: a standby that wins
        the lease then applies only what the fold touched since, instead of building the model of every
        node and running job in its first cycle (a few hundred ms at 12,500 nodes)."""
        self.policy.model_sync.sync(self.state, self._changes.take()).index()

    def idle(self) -> None:
        if self._tidy is not None:
            self._tidy()

    async def cycle(self) -> int:
        """One scheduling cycle, timed and counted (``rally_scheduler_cycle_duration_seconds``). The
        collector waits until its writes are stored (heap.py)."""
        started = time.perf_counter()
        result = "error"
        try:
            with collector_paused():
                appended = await self._cycle()
            result = "appended" if appended else "idle"
            return appended
        finally:
            SCHEDULER_CYCLE_SECONDS.labels(result=result).observe(time.perf_counter() - started)
            SCHEDULER_CYCLES.labels(result=result).inc()

    async def _cycle(self) -> int:
        """One scheduling cycle; returns the number of events it appended.

        Usually one fenced write of a few atomic batches: the decisions, all computed on one fold at one
        ``now`` and written in the order ``decision_writes`` gives, then the admissions (``JobQueued``) of
        the jobs that fold saw first. A queue assignment changes nothing the core reads, so it rides after
        the decisions instead of costing a round trip and a fold wait before them, and the binds reach the
        log first. Repairs and rejections are written first, in a write of their own, and folded before
        the decisions are computed: a repaired gang holds GPUs, a rejected job waits for nothing. The fold
        is awaited once before each computation, never between the writes of one step. The two steps are
        ``rallypoint.scheduling.cycle``'s, which the simulator's twin of this loop calls too."""
        await self._record_settings()
        await self.follower.wait_for(max(self.writer.fence, self._written))
        state = self.state
        now = self.clock()
        # The thread's CPU time of the steps that compute, summed around the awaits between them (the
        # fold runs in this thread while a write is awaited): the cycle's cost whatever else runs.
        cpu = time.thread_time()
        first, admissions = writes_before_deciding(state, now, self._repairs(state, now))
        computed = time.thread_time() - cpu
        if first:
            await self.follower.wait_for(await self._write(first))
            observe_writes((w.event for w in first), state, now, self.follower.traces)
        cpu = time.thread_time()
        decided = decide(self.policy, state, now, self._changes, epoch=self.epoch, admissions=admissions)
        if decided is None:
            return len(first)
        _, writes = decided
        SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS.observe(computed + time.thread_time() - cpu)
        self._written = await self._write(writes)
        observe_writes((w.event for w in writes), state, now, self.follower.traces)
        self.cycles += 1
        return len(first) + len(writes)

    async def _record_settings(self) -> None:
        """Record this epoch's settings once, fenced, before its first decision (the leader's epoch starts
        in ``lead``, which knows nothing of the scheduler's settings)."""
        if self._settings_epoch == self.epoch:
            return
        event = scheduler_settings(
            self.policy,
            epoch=self.epoch,
            leader_id=self.instance,
            queue_file=self.queue_file,
            repair_wait_s=self.repair_wait_s,
            at=self.clock(),
        )
        await self.writer.append(
            subjects.SCHEDULER_SETTINGS, event, f"scheduler-settings:{self.epoch}:{self.instance}"
        )
        self._settings_epoch = self.epoch

    async def _write(self, writes: list[Write]) -> int:
        """One fenced write of a cycle, timed (``rally_scheduler_write_seconds``) and counted: how fast
        the leader stores its decisions as it sees it (its own loop's delays included), beside ``rally
        bench eventlog``'s batched append. A cycle with nothing to write is not a write."""
        if not writes:
            return await self.writer.append_many(writes)
        started = time.perf_counter()
        last = await self.writer.append_many(writes)
        SCHEDULER_WRITE_SECONDS.observe(time.perf_counter() - started)
        SCHEDULER_EVENTS_WRITTEN.inc(sum(len(subjects.members(w.event)) for w in writes))
        return last

    def _repairs(self, state: ClusterState, now: float) -> list[Write]:
        """Interrupted gangs first: they hold GPUs already, and their replacement must not go to new work."""
        if not state.repairing_jobs():
            return []
        model = self.policy.model_sync.sync(state, self._changes.take())
        return repair_writes(
            state,
            model,
            now,
            epoch=self.epoch,
            policy_version=self.policy.version,
            at=now,
            repair_wait_s=self.repair_wait_s,
        )


def scheduler_settings(
    policy: SchedulingPolicy,
    *,
    epoch: int,
    leader_id: str,
    queue_file: str | None,
    repair_wait_s: float,
    at: float,
) -> SchedulerSettings:
    """The record of what a leader decides with: everything the core and the repair rule read besides the
    log (``rallypoint.audit.settings`` turns it back into a policy)."""
    return SchedulerSettings(
        epoch=epoch,
        leader_id=leader_id,
        policy=policy.name,
        policy_version=policy.version,
        policy_config=msgspec.to_builtins(policy.policy.config),
        queue_file=queue_file,
        queues=tuple(msgspec.to_builtins(policy.queues)),
        priority_classes=tuple(msgspec.to_builtins(policy.priority_classes)),
        repair_wait_s=repair_wait_s,
        at=at,
    )
