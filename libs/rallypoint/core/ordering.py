"""Queue-order plug-ins: in which order pending jobs are considered, and how jobs rank for preemption.

Every key ends with (submit time, arrival, job id), so the order is total and independent of the order
of ``Snapshot.pending``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rallypoint.core.context import Ctx
from rallypoint.core.types import PendingJob, RunningJob

if TYPE_CHECKING:
    from rallypoint.core.cluster import RunningColumns

__all__ = ["DrfPriorityOrder", "FifoOrder", "LasOrder", "Orderer", "PriorityOrder"]


class Orderer(Protocol):
    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        """Yield pending jobs in the order the cycle should consider them (may react to binds)."""
        ...

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        """Preemption rank of a pending job: it may preempt running jobs of strictly lower rank."""
        ...

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float: ...

    # Optional: ``running_rank_array(cols, ctx) -> np.ndarray``, the same ranks for every running job at
    # once (slot order of ``cols``); the preemption planner falls back to ``running_rank`` per job.


def _tie(job: PendingJob) -> tuple[float, int, str]:
    return (job.submit_time, job.arrival, job.id)


def class_rank_array(cols: RunningColumns, ctx: Ctx) -> np.ndarray:
    """Class value of every running job (``running_rank`` of the class-based orderers), vectorized."""
    lut = np.array([ctx.prio.get(c, 0) for c in cols.classes.names] or [0], np.float64)
    return lut[cols.cls[: cols.n]]


class FifoOrder:
    """Strict submission order."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        return iter(sorted(jobs, key=_tie))

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        return ctx.prio_of(job)

    def running_rank_array(self, cols: RunningColumns, ctx: Ctx) -> np.ndarray:
        return class_rank_array(cols, ctx)


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

    def running_rank_array(self, cols: RunningColumns, ctx: Ctx) -> np.ndarray:
        return class_rank_array(cols, ctx)


class DrfPriorityOrder(PriorityOrder):
    """Priority (plus aging), then weighted dominant-resource share of the team (lowest first), then
    submission order. Shares are updated as the cycle binds (progressive filling).

    Jobs of one (aged priority, team) group share the first two key parts, so inside a group the order is
    fixed (submission order): the heap holds one entry per group, keyed by the group's head job, instead
    of one per job. A lazy update re-pushes a group whose team's share grew since it was pushed; shares
    only grow during a cycle, so a stale key is always too small and the re-push is exact. This yields
    exactly the per-job order (the minimum of (priority, current share, tie) over all jobs) with one or
    two heap operations per job instead of one per job per bind of its team."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        groups: dict[tuple[int, str], list[PendingJob]] = {}
        # aged_priority inlined (same arithmetic): this loop runs for every pending job
        cfg = ctx.cfg
        prio = ctx.prio
        step, interval, cap = cfg.aging_step, cfg.aging_interval_s, cfg.aging_max
        aging = step > 0 and interval > 0
        now = ctx.now
        # jobs in submission order first, so every group's list comes out sorted (ids are unique: the tie
        # key is a total order, and appending in that order is the same as sorting each group)
        for j in sorted(jobs, key=_tie):
            p = prio.get(j.priority_class, 0)
            if aging:
                boost = int(max(0.0, now - j.submit_time) // interval) * step
                if cap is not None:
                    boost = min(boost, cap)
                p += boost
            key = (-p, j.team)
            g = groups.get(key)
            if g is None:
                groups[key] = [j]
            else:
                g.append(j)
        heap: list[tuple[int, float, float, int, str, int]] = []
        members: list[list[PendingJob]] = []
        pos: list[int] = []
        for (negp, team), js in sorted(groups.items()):
            h = js[0]
            heap.append((negp, ctx.dominant_share(team), h.submit_time, h.arrival, h.id, len(members)))
            members.append(js)
            pos.append(0)
        heapq.heapify(heap)
        shares = ctx._shares  # the memo behind ctx.dominant_share (read inline: this loop is hot)
        replace = heapq.heapreplace
        while heap:
            item = heap[0]
            gi = item[5]
            js = members[gi]
            k = pos[gi]
            j = js[k]
            now_share = shares.get(j.team)
            if now_share is None:
                now_share = ctx.dominant_share(j.team)
            if now_share > item[1]:
                new = (item[0], now_share, item[2], item[3], item[4], gi)
                replace(heap, new)
                if heap[0] is not new:
                    continue
            k += 1
            pos[gi] = k
            if k < len(js):
                h = js[k]
                replace(heap, (item[0], now_share, h.submit_time, h.arrival, h.id, gi))
            else:
                heapq.heappop(heap)
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
        if type(self).pending_level is not LasOrder.pending_level or type(self).level is not LasOrder.level:
            return iter(sorted(jobs, key=lambda j: (self.pending_level(j, ctx), *_tie(j))))  # a subclass
        # pending_level inlined (same arithmetic): the key is computed for every pending job
        ths = ctx.cfg.las_thresholds
        f = ctx.cfg.las_starvation_factor
        now = ctx.now

        def key(j: PendingJob) -> tuple[int, float, int, str]:
            if f > 0 and j.last_run_s > 0 and now - j.submit_time > f * j.last_run_s:
                k = 0
            else:
                a = j.attained_gpu_s
                k = 0
                for th in ths:
                    if a >= th:
                        k += 1
            return (k, j.submit_time, j.arrival, j.id)

        return iter(sorted(jobs, key=key))

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        return -self.pending_level(job, ctx)

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        attained = job.attained_gpu_s + job.gpus * max(0.0, ctx.now - job.start_time)
        return -self.level(attained, ctx)

    def running_rank_array(self, cols: RunningColumns, ctx: Ctx) -> np.ndarray:
        n = cols.n
        attained = cols.attained[:n] + cols.gpus[:n] * np.maximum(0.0, ctx.now - cols.start[:n])
        level = np.zeros(n, np.float64)
        for th in ctx.cfg.las_thresholds:
            level += attained >= th
        return -level
