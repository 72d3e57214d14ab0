"""The checkpoint service's loop: plan the jobs whose checkpoints changed, carry the plans out.

Level-triggered: a plan is recomputed from the folded state every time, so a restart (or a lost
action) needs no memory, only another pass. What *is* remembered is which jobs to look at: at 12,500
nodes there are thousands of jobs, and re-planning all of them on every event would make the service's
cost grow with the cluster instead of with the checkpoints. So:

- at start, every job is planned once (the log may hold work a previous instance left);
- then server-filtered follows of the checkpoint subjects (``rally.ckpt.>``, ours, and the agents'
  ``rally.agent.*.ckpt.*``; ``subjects.CHECKPOINT_FILTERS``) mark the job of each checkpoint event dirty
  once the fold has applied it (our own appends included: a verification may free older steps);
- a job whose work failed is retried on the next tick, and every ``sweep_s`` all jobs are planned again,
  the level-triggered backstop for anything the above could miss.

With ``partitions`` (several replicas), a replica plans only the jobs of the partitions it owns now; the
others' are dropped from its dirty set unplanned. At a gain it marks every job of the gained partitions
dirty, so what a killed (or deposed) owner left undone is done by the new owner at once, from the fold it
fenced (``runtime.partitions``: the new owner's fold holds everything the old one stored before its epoch).
At a loss, the work in flight for the jobs no longer ours is cancelled (its appends would be refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from rallypoint.checkpoints import RetentionPolicy, plan_jobs
from rallypoint.eventlog import AppendConflict, EventLog, Recorded
from rallypoint.events import CheckpointEvent, subjects
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import NotOwner, PartitionOwnership

from .actions import CheckpointActions

_log = logging.getLogger("rallypoint.checkpoint")

RESTART_DELAY_S = 1.0


class CheckpointKeeper:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        actions: CheckpointActions,
        *,
        policy: RetentionPolicy,
        tick_s: float = 5.0,
        sweep_s: float = 60.0,
        partitions: PartitionOwnership | None = None,
    ) -> None:
        self.log = log
        self.follower = follower
        self.actions = actions
        self.policy = policy
        self.tick_s = tick_s
        self.sweep_s = sweep_s
        self.partitions = partitions  # None: one replica, every job ours
        self.passes = 0  # plans computed, for tests and logs: proportional to changes, not to jobs
        self._dirty: set[str] = set()
        self._retry: set[str] = set()
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._generation = -1  # the ownership generation last looked at
        self._writers: dict[int, FencedWriter] = {}  # the owned partitions' writers at the last look
        if partitions is not None:
            partitions.listeners.append(self._wake.set)  # a gained partition's jobs are planned at once

    def mark(self, job_ids: Iterable[str]) -> None:
        self._dirty.update(job_ids)
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Nothing dirty, in flight or waiting for a retry."""
        return not (self._dirty or self._inflight or self._retry)

    async def run(self, stop: asyncio.Event) -> None:
        start = self.follower.state.last_seq + 1
        watchers = [
            asyncio.create_task(self._watch(start, subject_filter), name=f"ckpt-watch-{subject_filter}")
            for subject_filter in subjects.CHECKPOINT_FILTERS
        ]
        next_tick = next_sweep = time.monotonic()  # the first pass is a sweep: every job once
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_tick:
                    self.mark(self._retry)
                    self._retry.clear()
                    next_tick = now + self.tick_s
                if now >= next_sweep:
                    self.mark(self.follower.state.jobs)
                    next_sweep = now + self.sweep_s
                self._wake.clear()
                self._follow_ownership()
                self.reconcile()
                await _first_of(self._wake, stop, timeout=max(0.0, min(next_tick, next_sweep) - now))
        finally:
            for task in [*watchers, *self._inflight.values()]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _owns(self, job_id: str) -> bool:
        return self.partitions is None or self.partitions.owns(job_id)

    def _follow_ownership(self) -> None:
        """Partitions came or went since the last look: cancel the work of jobs no longer ours, and mark
        every job of the partitions gained dirty (a killed owner's pending verifications are ours now).
        Once per pass, however many partitions moved meanwhile (a start claims them one by one). A partition
        lost and regained between two looks has a new writer: its work in flight is cancelled and its jobs
        planned again, from a fold that holds what the owner in between did."""
        if self.partitions is None or self.partitions.generation == self._generation:
            return
        self._generation = self.partitions.generation
        writers = dict(self.partitions.writers)
        kept = {p for p, writer in writers.items() if self._writers.get(p) is writer}
        self._writers = writers
        partition_of = self.partitions.partition_of
        for job_id, task in list(self._inflight.items()):
            if partition_of(job_id) not in kept:
                task.cancel()
        gained = writers.keys() - kept
        if gained:
            self.mark(job_id for job_id in self.follower.state.jobs if partition_of(job_id) in gained)

    def reconcile(self) -> None:
        """Plan the dirty jobs that are ours and have no work in flight; start each non-empty plan. The
        dirty jobs of other replicas' partitions are dropped: a gain of their partition marks them again."""
        ready = {job_id for job_id in self._dirty if job_id not in self._inflight}
        self._dirty -= ready
        ready = {job_id for job_id in ready if self._owns(job_id)}
        self.passes += len(ready)
        for plan in plan_jobs(self.follower.state, ready, self.policy):
            task = asyncio.create_task(self.actions.carry_out(plan), name=f"ckpt-{plan.job_id}")
            self._inflight[plan.job_id] = task
            task.add_done_callback(self._finished(plan.job_id))

    def _finished(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._inflight.pop(job_id, None)
            if task.cancelled():
                if job_id in self._dirty:  # marked while it was being cancelled: plan it now
                    self._wake.set()
                return
            exc = task.exception()
            if exc is None:
                self.mark([job_id])  # the fold has the outcomes: plan again for any follow-up work
                return
            if isinstance(exc, NotOwner | AppendConflict) and not self._owns(job_id):
                # its partition moved (or a newer owner fenced it): the owner does the work now
                _log.info(
                    "job %s: its partition is not ours now; its checkpoint work is left to its owner", job_id
                )
                return
            _log.warning(
                "job %s: checkpoint work failed (%s: %s); will retry", job_id, type(exc).__name__, exc
            )
            self._retry.add(job_id)

        return done

    async def _watch(self, from_seq: int, subject_filter: str) -> None:
        """Mark the job of every checkpoint event on ``subject_filter`` dirty, once the fold applied it."""
        next_seq = from_seq
        while True:
            try:
                # quarantine=True: what the fold skips as unreadable, this follow skips too.
                follow = self.log.follow(from_seq=next_seq, subjects=subject_filter, quarantine=True)
                async for item in follow:
                    await self._folded(item.seq)
                    if isinstance(item, Recorded) and isinstance(item.event, CheckpointEvent):
                        self.mark([item.event.job_id])
                    next_seq = item.seq + 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The periodic sweep covers what is missed meanwhile; resume where we stopped.
                _log.warning("following %s failed at seq %d: %s; retrying", subject_filter, next_seq, exc)
                await asyncio.sleep(RESTART_DELAY_S)

    async def _folded(self, seq: int) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await self.follower.wait_for(seq, timeout=30.0)
                return
            _log.warning("the fold has not reached seq %d after 30 s; still waiting", seq)


async def _first_of(wake: asyncio.Event, stop: asyncio.Event, *, timeout: float) -> None:
    """Until ``wake`` or ``stop`` is set, or ``timeout`` passes."""
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
