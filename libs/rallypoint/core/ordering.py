"""Queue-order plug-ins: in which order pending jobs are considered, and how jobs rank for preemption.

Every key ends with (submit time, arrival, job id), so the order is total and independent of the order
of ``Snapshot.pending``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from itertools import islice
from operator import attrgetter, eq
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from rallypoint.core.context import Ctx
from rallypoint.core.formulas import (
    LEVEL_SPAN,
    aging_boost,
    dominant_share,
    estimate_level,
    estimate_levels,
    las_level,
    las_levels,
    pending_remaining,
    starving,
)
from rallypoint.core.types import PendingJob, RunningJob
from rallypoint.core.units import GPU_MILLI, job_milli
from rallypoint.userusage import user_keys

if TYPE_CHECKING:
    from rallypoint.core.cluster import RunningColumns

__all__ = [
    "ClassLasOrder",
    "DrfPriorityOrder",
    "FifoOrder",
    "LasOrder",
    "Orderer",
    "PriorityOrder",
    "estimate_level",
    "estimate_levels",
]


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
_submit_of = attrgetter("submit_time")

UserKeys = dict[tuple[str, str], float]


def fair_user_keys(ctx: Ctx) -> UserKeys:
    """(team, user) -> the user's decayed GPU-seconds per unit of weight in the team (``userusage``), for
    the users with any usage; memoized per cycle. Empty when no waiting job's user has used anything:
    every user's key is then 0 and the order is the one without users."""
    keys = ctx.cache.get("user_keys")
    if keys is None:
        snap = ctx.snap
        weights = {q.name: dict(q.user_weights) for q in snap.queues if q.user_weights}
        keys = ctx.cache["user_keys"] = user_keys(snap.user_usage, weights, ctx.now)
    return cast(UserKeys, keys)


def _user_tie(keys: UserKeys) -> Any:
    """The tie key with the user's fair-share key first: (user key, submit, arrival, id). A job without a
    user, or whose user has no usage, has key 0."""

    def key(j: PendingJob) -> tuple[float, float, int, str]:
        u = j.user
        return (keys.get((j.team, u), 0.0) if u is not None else 0.0, j.submit_time, j.arrival, j.id)

    return key


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
        p += aging_boost(ctx.now - job.submit_time, cfg.aging_step, cfg.aging_interval_s, cfg.aging_max)
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
    """Priority (plus aging), then weighted dominant-resource share of the team (lowest first), then the
    user's fair share inside the team (least decayed usage per weight first, ``userusage``), then
    submission order. Shares are updated as the cycle binds (progressive filling).

    Jobs of one (aged priority, team) group share the first two key parts, so inside a group the order is
    fixed (user key, then submission order): the heap holds one entry per group, keyed by the group's head
    job, instead of one per job. A lazy update re-pushes a group whose team's share grew since it was
    pushed; shares only grow during a cycle, so a stale key is always too small and the re-push is exact.
    This yields exactly the per-job order (the minimum of (priority, current share, tie) over all jobs)
    with one or two heap operations per job instead of one per job per bind of its team."""

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        groups: dict[tuple[int, str], list[PendingJob]] = {}
        # aged_priority without its lookups: this loop runs for every pending job
        cfg = ctx.cfg
        prio = ctx.prio
        step, interval, cap = cfg.aging_step, cfg.aging_interval_s, cfg.aging_max
        aging = step > 0 and interval > 0
        now = ctx.now
        # jobs in (user key, submission) order first, so every group's list comes out sorted (ids are
        # unique: the tie key is a total order, and appending in that order is the same as sorting each
        # group)
        keys = fair_user_keys(ctx)
        tie = _user_tie(keys)
        for j in sorted(jobs, key=tie):
            p = prio.get(j.priority_class, 0)
            if aging:
                p += aging_boost(now - j.submit_time, step, interval, cap)
            key = (-p, j.team)
            g = groups.get(key)
            if g is None:
                groups[key] = [j]
            else:
                g.append(j)
        heap: list[tuple[int, float, tuple[float, float, int, str], int]] = []
        members: list[list[PendingJob]] = []
        pos: list[int] = []
        for (negp, team), js in sorted(groups.items()):
            h = js[0]
            heap.append((negp, ctx.dominant_share(team), tie(h), len(members)))
            members.append(js)
            pos.append(0)
        heapq.heapify(heap)
        shares = ctx._shares  # the memo behind ctx.dominant_share (read inline: this loop is hot)
        replace = heapq.heapreplace
        while heap:
            item = heap[0]
            gi = item[3]
            js = members[gi]
            k = pos[gi]
            j = js[k]
            now_share = shares.get(j.team)
            if now_share is None:
                now_share = ctx.dominant_share(j.team)
            if now_share > item[1]:
                new = (item[0], now_share, item[2], gi)
                replace(heap, new)
                if heap[0] is not new:
                    continue
            k += 1
            pos[gi] = k
            if k < len(js):
                h = js[k]
                replace(heap, (item[0], now_share, tie(h), gi))
            else:
                heapq.heappop(heap)
            yield j


class LasOrder:
    """Tiresias 2D-LAS: discretized queues by attained GPU-seconds (demoted past each threshold), FIFO
    inside a queue. A starving job (waited > factor x its last run) is promoted to queue 0."""

    def level(self, attained: float, ctx: Ctx) -> int:
        return las_level(attained, ctx.cfg.las_thresholds)

    def pending_level(self, job: PendingJob, ctx: Ctx) -> int:
        if starving(job, ctx.now, ctx.cfg.las_starvation_factor):
            return 0
        return self.level(job.attained_gpu_s, ctx)

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        if type(self).pending_level is not LasOrder.pending_level or type(self).level is not LasOrder.level:
            return iter(sorted(jobs, key=lambda j: (self.pending_level(j, ctx), *_tie(j))))  # a subclass
        # pending_level without the method lookups: the key is computed for every pending job
        ths = ctx.cfg.las_thresholds
        f = ctx.cfg.las_starvation_factor
        now = ctx.now

        def key(j: PendingJob) -> tuple[int, float, int, str]:
            k = 0 if starving(j, now, f) else las_level(j.attained_gpu_s, ths)
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
        return -las_levels(attained, ctx.cfg.las_thresholds)


_SHARE_STEPS = 1024  # DRF shares are compared in steps of 1/1024 of the cluster (fewer heap re-pushes)
_TIER1 = 1 << 48  # tier bit of ClassLasOrder's packed heap prefix
_CLASS_SPAN = 2048  # class values (0..2047) inside a preemption rank
_LEVEL_SPAN = LEVEL_SPAN  # LAS levels (0..63)


def _widen(key: int, rbits: int, sbits: int, wide: int) -> int:
    """A ClassLasOrder heap key re-encoded with a ``wide``-bit share step field (was ``sbits``)."""
    r = key & ((1 << rbits) - 1)
    s = (key >> rbits & ((1 << sbits) - 1)) - (1 << (sbits - 1))
    return (key >> (sbits + rbits)) << (wide + rbits) | (s + (1 << (wide - 1))) << rbits | r


def guaranteed_gpus(job: PendingJob, elastic: bool) -> int:
    """The GPUs a job must have to run: an elastic gang's minimum (with elastic scheduling on), else what
    it asks for. The tier and reclaim measure this against a queue's nominal quota: a guarantee covers a
    gang's minimum, and what an elastic gang takes beyond it is borrowed (as Volcano's reclaim measures a
    PodGroup's minResources)."""
    return job.min_gpus if elastic and job.min_gpus is not None else job.gpus


def guaranteed_milli(job: PendingJob, elastic: bool) -> int:
    """``guaranteed_gpus`` as GPU quota (``units.job_milli``: thousandths of a GPU; a share's or a MIG
    slice's part of one): what the tier and the reclaim compare with a queue's nominal."""
    return job_milli(job, guaranteed_gpus(job, elastic))


def _prefix(band: int, level: int, p: int) -> int:
    """(-band, level, -class) packed into one int that sorts like the tuple (ClassLasOrder's heap)."""
    return ((_CLASS_SPAN - band) * _LEVEL_SPAN + level) * 2 * _CLASS_SPAN + _CLASS_SPAN - p


class ClassLasOrder:
    """Rallypoint's order: guaranteed quota, then priority band, then least attained service, then DRF.

    Key per job, smallest first: (tier, -band, LAS level, -class value, team's weighted dominant share,
    user's fair-share key, submit, arrival, id), where

    - *tier* is 0 while the job fits in what its queue has left of its nominal quota (of some GPU type),
      else 1: work inside a guaranteed share is considered before borrowing work. This is the order
      reclaim already enforces (a queue within nominal may evict borrowers of any class); ordering the
      same way keeps a reclaim victim from being re-admitted ahead of the job it was evicted for (both
      measure ``guaranteed_gpus``: an elastic gang's minimum, else its request; see
      ``RankPreemptor._within``);
    - *band* is the class value for classes of at least ``strict_class_min`` (every class when None):
      those are strictly first; lower classes share band 0, inside which the LAS level comes first and
      the class breaks ties;
    - *LAS level* is the Tiresias discretized attained-service queue (``las_thresholds`` on attained
      GPU-seconds): short jobs go first without knowing durations (heavy-tailed workloads). With
      ``level_by_estimate`` (rallypoint's default) it is instead a log2 step of expected *remaining*
      GPU-seconds (GPUs x runtime estimate left; attained service when there is no estimate, or once it
      is outrun): shortest remaining work first where users give time limits, LAS where they do not.
      A waiting job moves up one level per ``level_aging_s`` waited since it last ran (no starvation
      inside a band);
    - the DRF share (in steps of 1/1024) is updated as the cycle binds (progressive filling between
      teams);
    - the user's fair-share key is the decayed GPU-seconds the job's user used in its team per unit of
      the user's weight (``userusage``; org -> team -> user, as Slurm's fair-share tree): among the
      jobs the keys before it leave equal, the lighter user's go first. It does not change during a
      cycle (usage is service over time, as in Slurm), so it is part of the job's rank (``_ranked``).

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
        if cfg.level_by_estimate:
            k = estimate_level(pending_remaining(job), cfg.estimate_level_gpu_s)
        else:
            k = las_level(job.attained_gpu_s, cfg.las_thresholds)
        if k and cfg.level_aging_s > 0:
            since = job.last_preempted_at if job.last_preempted_at is not None else job.submit_time
            k = max(0, k - int(max(0.0, ctx.now - since) // cfg.level_aging_s))
        if k and starving(job, ctx.now, cfg.las_starvation_factor):
            k = 0
        return min(k, _LEVEL_SPAN - 1)

    @staticmethod
    def tier(queue: str, milli: int, ctx: Ctx) -> int:
        """0 while ``milli`` more thousandths of a GPU (a job's ``guaranteed_milli``) fit in ``queue``'s
        nominal quota (of some GPU type), else 1."""
        qb = ctx.quota
        if not qb.limited(queue):
            return 1
        usage = ctx.ws.usage
        for t in ctx.idx.types:
            if usage.get((queue, t), 0) + milli <= qb.nominal(queue, t):
                return 0
        return 1

    @staticmethod
    def _ranked(jobs: Iterable[PendingJob], ctx: Ctx | None = None) -> list[PendingJob]:
        """Stage 1: the jobs in (user key, submission) order; a job's place there is its rank.

        Every job gets its rank in submission order (the tie key (submit, arrival, id) is a total order:
        ids are unique), so a heap entry is one int, (prefix, share step, rank) packed, instead of the
        tuple (prefix, share step, submit, arrival, id, group): it sorts the same way and int comparisons
        are what the heap spends its time on. The rank also names the job, its group and the group's
        next job. Sorting on the submit time alone is the same as sorting on the whole tie key when no two
        jobs share a submit time (the usual case, and a cheaper sort: float keys instead of tuples);
        otherwise (or with a NaN, which compares inconsistently) sort on the whole key. Once some waiting
        job's user has used GPUs (``fair_user_keys``), the user's key comes first."""
        jobs = jobs if isinstance(jobs, (tuple, list)) else tuple(jobs)
        ranked = sorted(jobs, key=_submit_of)
        subs = list(map(_submit_of, ranked))
        total = sum(subs)  # NaN if some submit time is (or +inf and -inf meet: then just sort again)
        if total != total or any(map(eq, subs, islice(subs, 1, None))):
            ranked = sorted(jobs, key=_tie_of)
        keys = fair_user_keys(ctx) if ctx is not None else None
        if keys:
            # a stable sort on the user's key keeps the submission order among equal keys: the same as
            # sorting on (user key, submit, arrival, id), with a float key (a job without a user: 0)
            get = keys.get
            ranked.sort(key=lambda j: get((j.team, j.user), 0.0))
        return ranked

    def order(self, jobs: Iterable[PendingJob], ctx: Ctx) -> Iterator[PendingJob]:
        """Stages: rank (``_ranked``) -> group (``_groups``) -> first keys (``_first_keys``) -> pop the
        heap of groups, re-pushing a group whose tier or share changed since it was pushed."""
        ranked = self._ranked(jobs, ctx)
        n = len(ranked)
        if not n:
            return
        rbits = n.bit_length()
        rmask = (1 << rbits) - 1
        heads, nxt, info, noms = self._groups(ranked, ctx)
        firsts = self._first_keys(heads, noms, ctx)
        usage = ctx.ws.usage
        shares = ctx._shares  # the memo behind ctx.dominant_share (read inline: this loop is hot)
        # Heap key of a group: prefix << pshift | (share step + soff) << rbits | rank of its next job. The
        # step field is sbits wide, offset by soff so that any step in [-soff, soff) packs (in order); the
        # prefix packs (tier, -band, level, -class), and a tier change sets its _TIER1 bit (tier1 below).
        # Python ints make the packing exact for any prefix. Keys are distinct (ranks are), so the pop order
        # depends on the keys only. A step outside the field (a share above 2**21 with the 32-bit minimum:
        # only with absurd weights or usage) widens it: a re-encoding that keeps the order, so the heap
        # stays a heap.
        sbits = max(32, max(abs(s) for _p, s, _r in firsts).bit_length() + 2)
        soff = 1 << (sbits - 1)
        smask = (1 << sbits) - 1
        pshift = sbits + rbits
        tier1 = _TIER1 << pshift
        heap = [p << pshift | (s + soff) << rbits | r for p, s, r in firsts]
        heapq.heapify(heap)
        replace = heapq.heapreplace
        pop = heapq.heappop
        steps = _SHARE_STEPS
        # ctx.dominant_share without the method call for the memo misses (one per bind of a team): the
        # same function on the same (per-cycle constant) totals and weights, written to the same memo
        team_usage = ctx.team_usage
        totals = ctx.totals()
        wdiv = {team: ctx.weight_div(team) for team in {gk[1] for gk, _r in heads}}
        no_usage = (0, 0, 0)
        while heap:
            top = heap[0]
            r = top & rmask
            team, size, ukey, nom, rest = info[r]
            # tier test as above: an unlimited queue's groups start in tier 1, and tier 1 is final
            flip = False
            if not top & tier1 and usage.get(ukey, 0) + size > nom:
                for uk2, nm2 in rest:
                    if usage.get(uk2, 0) + size <= nm2:
                        break
                else:
                    flip = True
            sh = shares.get(team)
            if sh is None:
                sh = shares[team] = dominant_share(team_usage.get(team, no_usage), totals, wdiv[team])
            s = int(sh * steps) + soff
            if not 0 <= s <= smask:
                wide = max(2 * sbits, abs(s - soff).bit_length() + 2)
                heap = [_widen(k, rbits, sbits, wide) for k in heap]
                sbits, soff, smask, pshift = wide, 1 << (wide - 1), (1 << wide) - 1, wide + rbits
                tier1 = _TIER1 << pshift
                continue
            stored = top >> rbits & smask
            if flip or s != stored:
                # the group's current key (without rank): prefix (tier bit set on a flip) and share step
                cur = (top >> pshift << pshift | (tier1 if flip else 0)) + (s << rbits)
                # stale (the tier changed, or the share grew a step, since the key was pushed): re-push;
                # a share that shrank is not re-pushed (as with the tuple key: it only compared "grew")
                if flip or s > stored:
                    new = cur | r
                    replace(heap, new)
                    if heap[0] is not new:
                        continue
            else:
                cur = top - r
            k = nxt[r]
            if k >= 0:
                replace(heap, cur | k)
            else:
                pop(heap)
            yield ranked[r]

    def _groups(
        self, ranked: list[PendingJob], ctx: Ctx
    ) -> tuple[
        list[tuple[tuple[int, str, str, int], int]],
        list[int],
        list[tuple[str, int, tuple[str, str], int, list[tuple[tuple[str, str], int]]]],
        dict[str, list[tuple[tuple[str, str], int]] | None],
    ]:
        """Stage 2: group the ranked jobs by (packed (band, level, class) prefix, team, queue, size).

        Returns the groups' (key, head rank) in first-seen order, per rank the next rank of its group (-1
        after the last), per rank its group's info (team, size, first type's usage key and nominal, the
        other types' (usage key, nominal): the tier test at every pop, one dict lookup for the usual
        single GPU type) and per queue its (usage key, nominal) list (None: unlimited)."""
        n = len(ranked)
        prio = ctx.prio
        cfg = ctx.cfg
        unaged = cfg.level_aging_s <= 0 and cfg.las_starvation_factor <= 0
        by_estimate = unaged and cfg.level_by_estimate
        plain = unaged and not cfg.level_by_estimate
        unit = cfg.estimate_level_gpu_s
        ths = cfg.las_thresholds
        m = cfg.strict_class_min
        elastic = cfg.elastic
        level = self.pending_level
        qb = ctx.quota
        types = ctx.idx.types
        # per queue: its usage keys and nominals (the tier test, inlined at every pop), None: unlimited
        noms: dict[str, list[tuple[tuple[str, str], int]] | None] = {}
        # Groups keyed by (packed (band, level, class) prefix, team, queue, size); the packed prefix sorts
        # like (-band, level, -class). Per group: its last rank so far and its info; per rank: the next
        # rank of its group (-1 after the last) and its group's info: (team, size, first type's usage key,
        # first type's nominal, the other types' (usage key, nominal)) for the tier test at every pop
        # (one dict lookup for the usual single GPU type).
        groups: dict[tuple[int, str, str, int], list[Any]] = {}
        heads: list[tuple[tuple[int, str, str, int], int]] = []
        nxt = [-1] * n
        info: list[tuple[str, int, tuple[str, str], int, list[tuple[tuple[str, str], int]]]] = [
            ("", 0, ("", ""), 0, [])
        ] * n
        # per class (and, without aging, per attained value or per expected remaining work): the prefix,
        # computed once instead of per job
        bases: dict[str | None, dict[float, int]] = {}
        for r, j in enumerate(ranked):
            if plain:  # pending_level, memoized: a function of attained service only
                bc = bases.get(j.priority_class)
                if bc is None:
                    bc = bases[j.priority_class] = {}
                a = j.attained_gpu_s
                base = bc.get(a)
                if base is None:
                    lv = min(las_level(a, ths), _LEVEL_SPAN - 1)
                    p = prio.get(j.priority_class, 0)
                    base = bc[a] = _prefix(p if m is None or p >= m else 0, lv, p)
            elif by_estimate:  # pending_level, memoized: a function of expected remaining work only
                bc = bases.get(j.priority_class)
                if bc is None:
                    bc = bases[j.priority_class] = {}
                rem = pending_remaining(j)
                base = bc.get(rem)
                if base is None:
                    lv = estimate_level(rem, unit)
                    p = prio.get(j.priority_class, 0)
                    base = bc[rem] = _prefix(p if m is None or p >= m else 0, lv, p)
            else:
                p = prio.get(j.priority_class, 0)
                base = _prefix(p if m is None or p >= m else 0, level(j, ctx), p)
            team = j.team
            q = j.queue
            if q is None:
                q = team
            # guaranteed_milli(j, elastic), inlined for the usual whole-GPU job
            if j.gpu_milli is None and j.mig_profile is None:
                size = (j.min_gpus if elastic and j.min_gpus is not None else j.gpus) * GPU_MILLI
            else:
                size = job_milli(j, j.gpus)
            key = (base, team, q, size)
            g = groups.get(key)
            if g is None:
                if q in noms:
                    nl = noms[q]
                else:
                    nl = noms[q] = [((q, t), qb.nominal(q, t)) for t in types] if qb.limited(q) else None
                if nl:
                    g = groups[key] = [r, (team, size, nl[0][0], nl[0][1], nl[1:])]
                else:  # unlimited queue (or no GPU type): always tier 1, its tier never tested again
                    g = groups[key] = [r, (team, size, ("", ""), 0, [])]
                heads.append((key, r))
            else:
                nxt[g[0]] = r
                g[0] = r
            info[r] = g[1]
        return heads, nxt, info, noms

    @staticmethod
    def _first_keys(
        heads: list[tuple[tuple[int, str, str, int], int]],
        noms: dict[str, list[tuple[tuple[str, str], int]] | None],
        ctx: Ctx,
    ) -> list[tuple[int, int, int]]:
        """Stage 3: per group, its prefix with the tier bit (``tier``), its share step and its head rank."""
        usage = ctx.ws.usage
        share = ctx.dominant_share
        shares = ctx._shares  # the memo behind ctx.dominant_share (read inline: this loop is hot)
        # prefix (with the tier bit), share step and head rank of every group
        firsts: list[tuple[int, int, int]] = []
        for (prefix, team, q, size), r in heads:
            nl = noms[q]
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
            firsts.append((prefix, int(sh * _SHARE_STEPS), r))
        return firsts

    @staticmethod
    def _pack(band: Any, level: Any, p: Any) -> Any:
        """(band, 63 - level, class) as one number (floats or arrays)."""
        return (band * _LEVEL_SPAN + (_LEVEL_SPAN - 1 - level)) * _CLASS_SPAN + p

    def rank(self, job: PendingJob, ctx: Ctx) -> float:
        p = ctx.prio_of(job)
        return self._pack(self.band(p, ctx), self.pending_level(job, ctx), p)

    def running_level(self, job: RunningJob, ctx: Ctx) -> int:
        attained = job.attained_gpu_s + job.gpus * max(0.0, ctx.now - job.start_time)
        cfg = ctx.cfg
        if cfg.level_by_estimate:
            end = job.expected_end
            # an estimate outrun is no estimate: the job is then expected to run as long again as it has
            rem = job.gpus * (end - ctx.now) if end is not None and end > ctx.now else attained
            return estimate_level(rem, cfg.estimate_level_gpu_s)
        return min(_LEVEL_SPAN - 1, las_level(attained, cfg.las_thresholds))

    def running_rank(self, job: RunningJob, ctx: Ctx) -> float:
        p = ctx.prio_of(job)
        return self._pack(self.band(p, ctx), self.running_level(job, ctx), p)

    def running_rank_array(self, cols: RunningColumns, ctx: Ctx) -> np.ndarray:
        n = cols.n
        attained = cols.attained[:n] + cols.gpus[:n] * np.maximum(0.0, ctx.now - cols.start[:n])
        cfg = ctx.cfg
        if cfg.level_by_estimate:
            end = cols.exp_end[:n]
            with np.errstate(invalid="ignore"):
                live = end > ctx.now  # (NaN: no estimate)
            level = estimate_levels(
                np.where(live, cols.gpus[:n] * (end - ctx.now), attained), cfg.estimate_level_gpu_s
            )
        else:
            level = np.minimum(las_levels(attained, cfg.las_thresholds), _LEVEL_SPAN - 1)
        p = class_rank_array(cols, ctx)
        m = ctx.cfg.strict_class_min
        band = p if m is None else np.where(p >= m, p, 0.0)
        return np.asarray(self._pack(band, level, p), np.float64)
