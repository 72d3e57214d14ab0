"""Queue-order plug-ins: in which order pending jobs are considered, and how jobs rank for preemption.

Every key ends with (submit time, arrival, job id), so the order is total and independent of the order
of ``Snapshot.pending``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rallypoint.core.context import Ctx
from rallypoint.core.types import PendingJob, RunningJob

if TYPE_CHECKING:
    from rallypoint.core.cluster import RunningColumns

__all__ = ["ClassLasOrder", "DrfPriorityOrder", "FifoOrder", "LasOrder", "Orderer", "PriorityOrder"]


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


_tie_of = attrgetter("submit_time", "arrival", "id")  # _tie without a Python call per job


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


_SHARE_STEPS = 1024  # DRF shares are compared in steps of 1/1024 of the cluster (fewer heap re-pushes)
_TIER1 = 1 << 48  # tier bit of ClassLasOrder's packed heap prefix
_CLASS_SPAN = 2048  # class values (0..2047) inside a preemption rank
_LEVEL_SPAN = 64  # LAS levels (0..63)


def _prefix(band: int, level: int, p: int) -> int:
    """(-band, level, -class) packed into one int that sorts like the tuple (ClassLasOrder's heap)."""
    return ((_CLASS_SPAN - band) * _LEVEL_SPAN + level) * 2 * _CLASS_SPAN + _CLASS_SPAN - p


class ClassLasOrder:
    """Rallypoint's order: guaranteed quota, then priority band, then least attained service, then DRF.

    Key per job, smallest first: (tier, -band, LAS level, -class value, team's weighted dominant share,
    submit, arrival, id), where

    - *tier* is 0 while the job fits in what its queue has left of its nominal quota (of some GPU type),
      else 1: work inside a guaranteed share is considered before borrowing work. This is the order
      reclaim already enforces (a queue within nominal may evict borrowers of any class); ordering the
      same way keeps a
      reclaim victim from being re-admitted ahead of the job it was evicted for;
    - *band* is the class value for classes of at least ``strict_class_min`` (every class when None):
      those are strictly first; lower classes share band 0, inside which the LAS level comes first and
      the class breaks ties;
    - *LAS level* is the Tiresias discretized attained-service queue (``las_thresholds`` on attained
      GPU-seconds): short jobs go first without knowing durations (heavy-tailed workloads); a waiting job
      moves up one level per ``level_aging_s`` waited since it last ran (no starvation inside a band);
    - the DRF share (in steps of 1/1024) is updated as the cycle binds (progressive filling between
      teams).

    Tier and share only grow during a cycle (binds), so, as in :class:`DrfPriorityOrder`, the heap keeps
    one entry per (band, level, class, team, queue, size) group, keyed by the group's head
    job, with a lazy
    re-push.

    Preemption rank: (band, 63 - level, class) packed in one number. A pending job may preempt running
    jobs of lower rank (attained service counted up to now); the preemptor restricts victims of other
    queues to borrowers (``RankPreemptor(borrowers_only=True)``).
    """

    @staticmethod
    def band(p: int, ctx: Ctx) -> int:
        m = ctx.cfg.strict_class_min
        return p if m is None or p >= m else 0

    def pending_level(self, job: PendingJob, ctx: Ctx) -> int:
        cfg = ctx.cfg
        a = job.attained_gpu_s
        k = 0
        for th in cfg.las_thresholds:
            if a >= th:
                k += 1
        if k and cfg.level_aging_s > 0:
            since = job.last_preempted_at if job.last_preempted_at is not None else job.submit_time
            k = max(0, k - int(max(0.0, ctx.now - since) // cfg.level_aging_s))
        f = cfg.las_starvation_factor
        if k and f > 0 and job.last_run_s > 0 and ctx.now - job.submit_time > f * job.last_run_s:
            k = 0
        return min(k, _LEVEL_SPAN - 1)

    @staticmethod
    def tier(queue: str, gpus: int, ctx: Ctx) -> int:
        """0 while ``gpus`` more GPUs fit in ``queue``'s nominal quota (of some GPU type), else 1."""
        qb = ctx.quota
        if not qb.limited(queue):
            return 1
        usage = ctx.ws.usage
        for t in ctx.idx.types:
            if usage.get((queue, t), 0) + gpus <= qb.nominal(queue, t):
                return 0
        return 1

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        # groups keyed by (packed (band, level, class) prefix, team, queue, size); the packed prefix sorts
        # like (-band, level, -class), so the groups sort as with the unpacked key
        groups: dict[tuple[int, str, str, int], list[PendingJob]] = {}
        prio = ctx.prio
        cfg = ctx.cfg
        plain = cfg.level_aging_s <= 0 and cfg.las_starvation_factor <= 0
        ths = cfg.las_thresholds
        m = cfg.strict_class_min
        level = self.pending_level
        # per class (and, without aging, per attained value): the prefix, computed once instead of per job
        bases: dict[str | None, dict[float, int]] = {}
        for j in jobs:
            if plain:  # pending_level inlined: a function of attained service only
                bc = bases.get(j.priority_class)
                if bc is None:
                    bc = bases[j.priority_class] = {}
                a = j.attained_gpu_s
                base = bc.get(a)
                if base is None:
                    lv = 0
                    if a > 0:
                        for th in ths:
                            if a >= th:
                                lv += 1
                        lv = min(lv, _LEVEL_SPAN - 1)
                    p = prio.get(j.priority_class, 0)
                    base = bc[a] = _prefix(p if m is None or p >= m else 0, lv, p)
            else:
                p = prio.get(j.priority_class, 0)
                base = _prefix(p if m is None or p >= m else 0, level(j, ctx), p)
            q = j.queue
            key = (base, j.team, q if q is not None else j.team, j.gpus)
            g = groups.get(key)
            if g is None:
                groups[key] = [j]
            else:
                g.append(j)
        # each group in submission order (the tie key is a total order: sorting the small groups is the
        # same as appending in globally sorted order, with fewer comparisons)
        for g in groups.values():
            if len(g) > 1:
                g.sort(key=_tie_of)
        # tier inlined (same arithmetic as ``tier``; it is evaluated at every pop): per queue, its usage
        # keys and nominals, None for an unlimited queue
        qb = ctx.quota
        usage = ctx.ws.usage
        types = ctx.idx.types
        noms: dict[str, list[tuple[tuple[str, str], int]] | None] = {}
        share = ctx.dominant_share
        shares = ctx._shares  # the memo behind ctx.dominant_share (read inline: this loop is hot)
        # heap entry: (prefix, share step, submit, arrival, id, group); prefix packs (tier, -band, level,
        # -class) into one int (cheaper tuple comparisons); a tier change sets _TIER1 in it
        heap: list[tuple[int, int, float, int, str, int]] = []
        members: list[list[PendingJob]] = []
        pos: list[int] = []
        ginfo: list[tuple[str, list[tuple[tuple[str, str], int]] | None, int]] = []
        for key, js in sorted(groups.items()):
            h = js[0]
            prefix, team, q, size = key
            if q in noms:
                nl = noms[q]
            else:
                nl = noms[q] = [((q, t), qb.nominal(q, t)) for t in types] if qb.limited(q) else None
            # tier(q, size): 1 unless some type's nominal still has room for the group's size
            if nl is None:
                prefix |= _TIER1
            else:
                for uk, nm in nl:
                    if usage.get(uk, 0) + size <= nm:
                        break
                else:
                    prefix |= _TIER1
            sh = shares.get(team)
            if sh is None:
                sh = share(team)
            heap.append((prefix, int(sh * _SHARE_STEPS), h.submit_time, h.arrival, h.id, len(members)))
            members.append(js)
            pos.append(0)
            ginfo.append((team, nl, size))
        if not heap:
            return
        heapq.heapify(heap)
        replace = heapq.heapreplace
        # ctx.dominant_share inlined for the memo misses (one per bind of a team): the same arithmetic on
        # the same (per-cycle constant) totals and weights, written to the same memo
        team_usage = ctx.team_usage
        tg, tc, tm = ctx.totals()
        wdiv = {team: max(ctx.weights.get(team, 1.0), 1e-9) for team, _nl, _size in ginfo}
        while heap:
            item = heap[0]
            gi = item[5]
            team, nl, size = ginfo[gi]
            prefix = item[0]
            if not prefix & _TIER1:  # (an unlimited queue's groups start in tier 1)
                for uk, nm in nl or ():
                    if usage.get(uk, 0) + size <= nm:
                        break
                else:
                    prefix |= _TIER1
            sh = shares.get(team)
            if sh is None:
                ug, uc, um = team_usage.get(team, (0, 0, 0))
                sh = shares[team] = max(ug / tg, uc / tc, um / tm) / wdiv[team]
            s_now = int(sh * _SHARE_STEPS)
            if prefix != item[0] or s_now > item[1]:
                new = (prefix, s_now, item[2], item[3], item[4], gi)
                replace(heap, new)
                if heap[0] is not new:
                    continue
            js = members[gi]
            k = pos[gi]
            j = js[k]
            k += 1
            pos[gi] = k
            if k < len(js):
                h = js[k]
                replace(heap, (prefix, s_now, h.submit_time, h.arrival, h.id, gi))
            else:
                heapq.heappop(heap)
            yield j

    @staticmethod
    def _pack(band: Any, level: Any, p: Any) -> Any:
        """(band, 63 - level, class) as one number (floats or arrays)."""
        return (band * _LEVEL_SPAN + (_LEVEL_SPAN - 1 - level)) * _CLASS_SPAN + p

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        p = ctx.prio_of(job)
        return self._pack(self.band(p, ctx), self.pending_level(job, ctx), p)

    def running_level(self, job: RunningJob, ctx: Ctx) -> int:
        attained = job.attained_gpu_s + job.gpus * max(0.0, ctx.now - job.start_time)
        return min(_LEVEL_SPAN - 1, sum(1 for th in ctx.cfg.las_thresholds if attained >= th))

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        p = ctx.prio_of(job)
        return self._pack(self.band(p, ctx), self.running_level(job, ctx), p)

    def running_rank_array(self, cols: RunningColumns, ctx: Ctx) -> np.ndarray:
        n = cols.n
        attained = cols.attained[:n] + cols.gpus[:n] * np.maximum(0.0, ctx.now - cols.start[:n])
        level = np.zeros(n, np.float64)
        for th in ctx.cfg.las_thresholds:
            level += attained >= th
        level = np.minimum(level, _LEVEL_SPAN - 1)
        p = class_rank_array(cols, ctx)
        m = ctx.cfg.strict_class_min
        band = p if m is None else np.where(p >= m, p, 0.0)
        return np.asarray(self._pack(band, level, p), np.float64)
