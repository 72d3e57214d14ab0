"""The preemption shell: follow every eviction from its request to its end, and say what it cost.

It decides nothing and re-runs no cycle: the scheduler writes each cycle's whole output (binds, preemption
requests, pending reasons) through its one fenced writer, and the job controller stops each victim
(SIGTERM, a grace period for a checkpoint, SIGKILL, ``JobPreempted`` with the work lost). This service
owns the protocol's view: it logs each eviction that begins, warns once about one that outlives its grace
period (its preemptor waits on GPUs still held), and logs each one that ends, with its duration and the
GPU-seconds of work lost (``rallypoint.control.eviction``). It writes nothing to the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from rallypoint.control.eviction import Eviction, Key, Review, review
from rallypoint.control.reconcile import PREEMPTION_GRACE_S
from rallypoint.runtime.follower import Follower

_log = logging.getLogger("rallypoint.preemption")

#: After the grace period the job controller still waits this long for the victim's ranks to report.
OVERDUE_MARGIN_S = 10.0


class EvictionWatch:
    def __init__(
        self,
        follower: Follower,
        *,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
        grace_s: float = PREEMPTION_GRACE_S,
    ) -> None:
        self.follower = follower
        self.clock = clock
        self.tick_s = tick_s
        self.overdue_after_s = grace_s + OVERDUE_MARGIN_S
        self.open: dict[Key, Eviction] = {}
        self.warned: set[Key] = set()
        self.lost_gpu_s = 0.0  # work lost to the evictions this watcher saw end
        self.ended = 0
        # What the fold touched since the last look: a look costs the jobs changed, not every job ever.
        self._changes = follower.changes()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.follower.changed.clear()
            self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.follower.changed.wait(), self.tick_s)

    def step(self) -> Review:
        """One look at the fold; logs what changed since the last."""
        changes = self._changes.take()
        seen = review(
            self.follower.state,
            self.open,
            self.warned,
            self.clock(),
            overdue_after_s=self.overdue_after_s,
            touched=None if changes.everything else changes.jobs,
        )
        for e in seen.began:
            what = (e.job_id, e.attempt, e.gpus, e.for_job, e.reason)
            _log.info("eviction of %s (attempt %d, %d GPUs) for %s: %s", *what)
        for e in seen.overdue:
            self.warned.add((e.job_id, e.attempt))
            _log.warning("eviction of %s for %s is overdue: its GPUs are still held", e.job_id, e.for_job)
        for end in seen.ended:
            self.warned.discard((end.eviction.job_id, end.eviction.attempt))
            self.lost_gpu_s += end.lost_gpu_s
            self.ended += 1
            _log.info(
                "eviction of %s ended (%s) after %.1f s; %.1f GPU-s of work lost (%.1f in all)",
                end.eviction.job_id,
                end.outcome,
                end.took_s,
                end.lost_gpu_s,
                self.lost_gpu_s,
            )
        self.open = seen.open
        return seen
