"""Queue-order plug-ins: in which order pending jobs are considered, and how jobs rank for preemption.

Every key ends with (submit time, arrival, job id), so the order is total and independent of the order
of ``Snapshot.pending``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Protocol

from rallypoint.core.context import Ctx
from rallypoint.core.types import PendingJob, RunningJob

__all__ = ["DrfPriorityOrder", "FifoOrder", "LasOrder", "Orderer", "PriorityOrder"]


class Orderer(Protocol):
    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        """Yield pending jobs in the order the cycle should consider them (may react to binds)."""
        ...

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        """Preemption rank of a pending job: it may preempt running jobs of strictly lower rank."""
        ...

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float: ...


def _tie(job: PendingJob) -> tuple[float, int, str]:
    return (job.submit_time, job.arrival, job.id)


class FifoOrder:
    """Strict submission order."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        return iter(sorted(jobs, key=_tie))

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)


def aged_priority(job: PendingJob, ctx: Ctx) -> int:
    """Class value plus aging: ``aging_step`` per ``aging_interval_s`` waited (so no job waits forever:
    with no cap, any job eventually outranks every fresh job)."""
    cfg = ctx.cfg
    p = ctx.prio_of(job)
    if cfg.aging_step > 0 and cfg.aging_interval_s > 0:
        boost = int(max(0.0, ctx.now - job.submit_time) // cfg.aging_interval_s) * cfg.aging_step
        if cfg.aging_max is not None:
            boost = min(boost, cfg.aging_max)
        p += boost
    return p


class PriorityOrder:
    """Priority class (plus aging) first, then submission order. Preemption compares class values only,
    so aging lets a job run earlier but never lets it evict a higher class."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        return iter(sorted(jobs, key=lambda j: (-aged_priority(j, ctx), *_tie(j))))

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)


class DrfPriorityOrder(PriorityOrder):
    """Priority (plus aging), then weighted dominant-resource share of the team (lowest first), then
    submission order. Shares are updated as the cycle binds (progressive filling): a lazy heap re-pushes
    a job whose team's share grew since it was pushed; shares only grow during a cycle, so a stale key is
    always too small and the re-push is exact."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        heap: list[tuple[int, float, float, int, str, PendingJob]] = []
        share: dict[str, float] = {}
        for j in jobs:
            s = share.get(j.team)
            if s is None:
                s = share[j.team] = ctx.dominant_share(j.team)
            heap.append((-aged_priority(j, ctx), s, j.submit_time, j.arrival, j.id, j))
        heapq.heapify(heap)
        while heap:
            item = heapq.heappop(heap)
            j = item[5]
            now_share = ctx.dominant_share(j.team)
            if now_share > item[1]:
                new = (item[0], now_share, item[2], item[3], item[4], j)
                if heap and new[:5] > heap[0][:5]:
                    heapq.heappush(heap, new)
                    continue
            yield j


class LasOrder:
    """Tiresias 2D-LAS: discretized queues by attained GPU-seconds (demoted past each threshold), FIFO
    inside a queue. A starving job (waited > factor x its last run) is promoted to queue 0."""

    def level(self, attained: float, ctx: Ctx) -> int:
        k = 0
        for th in ctx.cfg.las_thresholds:
            if attained >= th:
                k += 1
        return k

    def pending_level(self, job: PendingJob, ctx: Ctx) -> int:
        f = ctx.cfg.las_starvation_factor
        if f > 0 and job.last_run_s > 0 and ctx.now - job.submit_time > f * job.last_run_s:
            return 0
        return self.level(job.attained_gpu_s, ctx)

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        return iter(sorted(jobs, key=lambda j: (self.pending_level(j, ctx), *_tie(j))))

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        return -self.pending_level(job, ctx)

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        attained = job.attained_gpu_s + job.gpus * max(0.0, ctx.now - job.start_time)
        return -self.level(attained, ctx)
