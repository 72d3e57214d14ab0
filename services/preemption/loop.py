"""The preemption shell: follow every eviction from its request to its end, and say what it cost.

It decides nothing and re-runs no cycle: the scheduler writes each cycle's whole output (binds, preemption
requests, pending reasons) through its one fenced writer, and the job controller stops each victim
(SIGTERM, a grace period for a checkpoint, SIGKILL, ``JobPreempted`` with the work lost). This service
owns the protocol's view: it logs each eviction that begins, warns once about one that outlives its grace
period (its preemptor waits on GPUs still held), and logs each one that ends, with its duration and the
GPU-seconds of work lost (``rallypoint.control.eviction``). It writes nothing to the log.

N replicas split the reports by job (``owns``: the job's partition is this replica's share, see
``runtime.partitions.WorkShare``). Every replica follows every eviction, so one whose share grows (a
replica was killed) reports the evictions it takes over from where they stand: overdue at its next look,
ended when they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from rallypoint.control.eviction import Ended, Eviction, Key, Review, review
from rallypoint.control.reconcile import PREEMPTION_GRACE_S
from rallypoint.events import subjects
from rallypoint.runtime.follower import Follower

_log = logging.getLogger("rallypoint.preemption")

#: After the grace period the job controller still waits this long for the victim's ranks to report.
OVERDUE_MARGIN_S = 10.0
#: How long a replica remembers another's evictions that ended, in case their jobs become its own: a killed
#: replica's share moves one membership TTL (1.2 s by default) after its last presence, plus a round.
HANDOVER_S = 10.0
#: The evictions fall into partitions by job, shared by the live replicas (``runtime.partitions.WorkShare``):
#: the job controller's hash and count, so a job's partition number is the same for both services.
PARTITIONS = subjects.CONTROL_PARTITIONS
ROLE = "preemption"


class EvictionWatch:
    def __init__(
        self,
        follower: Follower,
        *,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
        grace_s: float = PREEMPTION_GRACE_S,
        owns: Callable[[str], bool] = lambda job_id: True,
        handover_s: float = HANDOVER_S,
    ) -> None:
        self.follower = follower
        self.clock = clock
        self.tick_s = tick_s
        self.overdue_after_s = grace_s + OVERDUE_MARGIN_S
        self.owns = owns
        self.handover_s = handover_s
        self.open: dict[Key, Eviction] = {}  # every replica's: one whose share grows goes on from here
        self.watched: set[Key] = set()  # the open evictions this replica reports
        self.warned: set[Key] = set()
        self.lost_gpu_s = 0.0  # work lost to the evictions this watcher saw end
        self.ended = 0
        # Another replica's evictions that ended lately, with when: reported here if their job becomes
        # ours within ``handover_s`` (its owner may have been killed before it could say so).
        self._others_ended: list[tuple[float, Ended]] = []
        # What the fold touched since the last look: a look costs the jobs changed, not every job ever.
        self._changes = follower.changes()
        self._changed = follower.change_signal()  # its own: the fold may be shared (runtime.cohost)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._changed.clear()
            self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.tick_s)

    def step(self) -> Review:
        """One look at the fold; logs what changed since the last, for the jobs this replica owns."""
        changes = self._changes.take()
        now = self.clock()
        seen = review(
            self.follower.state,
            self.open,
            self.warned,
            now,
            overdue_after_s=self.overdue_after_s,
            touched=None if changes.everything else changes.jobs,
        )
        for e in seen.began:
            if self.owns(e.job_id):
                self.watched.add((e.job_id, e.attempt))
                what = (e.job_id, e.attempt, e.gpus, e.for_job, e.reason)
                _log.info("eviction of %s (attempt %d, %d GPUs) for %s: %s", *what)
        # Another replica's overdue evictions stay un-warned here, for the day they are ours.
        for e in seen.overdue:
            if self.owns(e.job_id):
                self.warned.add((e.job_id, e.attempt))
                _log.warning("eviction of %s for %s is overdue: its GPUs are still held", e.job_id, e.for_job)
        for end in seen.ended:
            key = (end.eviction.job_id, end.eviction.attempt)
            self.warned.discard(key)
            self.watched.discard(key)
            if self.owns(end.eviction.job_id):
                self._report_end(end)
            else:
                self._others_ended.append((now, end))
        self.open = seen.open
        self._take_over(now)
        return seen

    def _take_over(self, now: float) -> None:
        """The evictions of jobs that became ours (a replica left or was killed): those still open are
        watched from here on, those that ended within ``handover_s`` are reported ended now. Either may
        have been said by the replica before us too: a report twice rather than none."""
        for key, e in self.open.items():
            if key not in self.watched and self.owns(e.job_id):
                self.watched.add(key)
                _log.info(
                    "watching eviction of %s for %s (taken over; open %.1f s)",
                    e.job_id,
                    e.for_job,
                    now - e.seen_at,
                )
        if not self._others_ended:
            return
        kept: list[tuple[float, Ended]] = []
        for at, end in self._others_ended:
            if self.owns(end.eviction.job_id):
                self._report_end(end, taken_over=True)
            elif now - at < self.handover_s:
                kept.append((at, end))
        self._others_ended = kept

    def _report_end(self, end: Ended, *, taken_over: bool = False) -> None:
        self.lost_gpu_s += end.lost_gpu_s
        self.ended += 1
        _log.info(
            "eviction of %s ended (%s) after %.1f s; %.1f GPU-s of work lost (%.1f in all)%s",
            end.eviction.job_id,
            end.outcome,
            end.took_s,
            end.lost_gpu_s,
            self.lost_gpu_s,
            " (taken over)" if taken_over else "",
        )
