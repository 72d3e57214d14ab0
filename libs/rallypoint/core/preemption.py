"""Least-disruptive preemption: shrink elastic gangs, then reclaim borrowed quota, then preempt by rank.

Order of actions (KAI: allocate > consolidate > reclaim > preempt): the engine has already tried to
allocate; here candidates are, cheapest first,

1. *shrink*: elastic running gangs above their minimum whose rank is not above the preemptor's;
2. *reclaim*: jobs of queues borrowing above nominal, when the preemptor's queue is within its nominal
   (the only case where equal or higher priority may be evicted: guaranteed quota comes back). A queue
   stops being a reclaim source as soon as what is already being evicted from it (this cycle, or by
   victims still stopping) brings it down to its nominal. With ``borrowers_only`` (rallypoint) the
   preemptor's queue must fit its ``guaranteed_gpus`` (an elastic gang's minimum, else its request)
   within nominal: the test of ``ClassLasOrder``'s tier 0, so the preemptor is ordered before the
   borrowers it evicts when they wait again and none of them is re-admitted into the GPUs freed for it
   (``RankPreemptor._within``);
3. *priority*: jobs of strictly lower rank (class value; LAS: attained-service queue).

Never: non-preemptible jobs or classes, jobs preempted less than ``preemption_protection_s`` ago, jobs
already chosen this cycle, jobs still stopping for an earlier preemptor (``RunningJob.preempting_for``).

Victims are grouped by the topology domain the preemptor needs (node / rack / spine / cluster). Walking
candidates in cost order (kind, rank, GPU-seconds lost since last checkpoint, larger first, id), the first
few domains whose accumulated GPUs reach the gang's size are estimated (worst kind, victims, work lost),
and the cheapest few are verified with a real placement on the workspace (journaled, rolled back). A
verified set is then pruned: victims are put back one by one, most expensive first, while the gang still
fits, so no victim is evicted that the placement does not need. The cheapest pruned plan wins.

Cost: the candidate index (cost order of every running job, its tasks' locations) is a handful of numpy
operations per cycle over the incrementally kept ``ClusterModel.cols``; per preemptor the domain walk is
vectorized (sort by domain and candidate position, cumulative sums), and Python work is limited to the
victims of the few verified domains.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import mul
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from rallypoint.core.context import Ctx
from rallypoint.core.ordering import class_rank_array, guaranteed_gpus
from rallypoint.core.placement import LEVELS, Plan, level_rank, place
from rallypoint.core.types import PendingJob, RunningJob
from rallypoint.core.units import GPU_MILLI

if TYPE_CHECKING:
    from rallypoint.core.ordering import Orderer

__all__ = [
    "Candidate",
    "PreemptionPlan",
    "Preemptor",
    "RankPreemptor",
    "RunningView",
    "drop_chosen",
    "job_tasks",
    "running_view",
]

_VERIFY_DOMAINS = 4


class Candidate(NamedTuple):
    kind: int  # 0 shrink, 1 reclaim, 2 priority (lower class), 3 las (same class, more attained service)
    rank: float
    lost: float  # GPU-seconds of work lost since the last checkpoint
    job: RunningJob
    tasks: tuple[tuple[int, int], ...]  # (ordinal, mask) freed
    remove: tuple[int, ...]  # task indices removed by a shrink (empty for an eviction)
    seq: int = 0  # shrink chunks of one job: the last tasks go first

    @property
    def reason(self) -> str:
        return ("shrink", "reclaim", "priority", "las")[self.kind]

    @property
    def gpus(self) -> int:
        return sum(m.bit_count() for _o, m in self.tasks)

    def cost(self) -> tuple[int, float, float, int, str, int]:
        """Total order of disruption (smaller = cheaper)."""
        return (self.kind, self.rank, self.lost, -self.gpus, self.job.id, self.seq)


class PreemptionPlan(NamedTuple):
    victims: tuple[Candidate, ...]
    plan: Plan


class RunningView:
    """Per-cycle candidate index over ``ClusterModel.cols``: every running job's preemption rank, work
    lost, cost order and base eligibility, and its tasks' node ordinals. Built once per cycle (numpy), shared
    by all preemptors of the cycle."""

    def __init__(self, ctx: Ctx, orderer: Orderer) -> None:
        cols = ctx.cluster.cols
        n = cols.n
        self.cols = cols
        self.n = n
        now = ctx.now
        fn = getattr(orderer, "running_rank_array", None)
        if fn is not None:
            rank = np.asarray(fn(cols, ctx), np.float64)
        else:  # a plug-in orderer without the vectorized hook: one call per running job
            running = ctx.cluster.running
            rank = np.fromiter((orderer.running_rank(running[j], ctx) for j in cols.ids), np.float64, count=n)
        gpus = cols.gpus[:n]
        lost = gpus * np.maximum(0.0, now - cols.since[:n])
        ids = cols.ids
        if n > 1 and not (np.isnan(lost).any() or np.isnan(rank).any()):
            # cost order (rank, lost, -GPUs, job id): sorted on lost (any order among equal values), then
            # stably on rank; runs of equal (rank, lost) are then ordered by (-GPUs, id). The same order
            # as a three-key lexsort with id tie-breaks, with two sorts instead of three
            order = np.argsort(lost)
            order = order[np.argsort(rank[order], kind="stable")]
            r_s, l_s = rank[order], lost[order]
            _sort_runs(
                order, (r_s[1:] == r_s[:-1]) & (l_s[1:] == l_s[:-1]), lambda s: (-int(gpus[s]), ids[s])
            )
        else:  # (NaN sorts last but equals nothing: keep the lexsort's exact order for it)
            order = np.lexsort((-gpus, lost, rank))
            if n > 1:
                # exact ties on (rank, lost, GPUs) are broken by job id, never by slot (history) order
                r_s, l_s, g_s = rank[order], lost[order], gpus[order]
                eq = (r_s[1:] == r_s[:-1]) & (l_s[1:] == l_s[:-1]) & (g_s[1:] == g_s[:-1])
                _sort_runs(order, eq, lambda s: ids[s])
        self.rank = rank
        self.lost = lost
        self.order = order
        names = cols.classes.names
        class_ok = np.array([ctx.class_preemptible.get(c, True) for c in names] or [True], np.bool_)
        protect = ctx.cfg.preemption_protection_s
        sp = ctx.cfg.start_protection_s
        # preemptible at all (reclaim of borrowed quota may take any of these)
        self.base = cols.preemptible[:n] & class_ok[cols.cls[:n]] & ~cols.stopping[:n]
        self.protected = now - cols.last_preempted[:n] < protect  # preempted recently
        # started or preempted recently: no LAS (same-class) victim yet; equal to ``protected`` without
        # ``start_protection_s``
        self.protected_las = (
            self.protected if sp is None else now - np.maximum(cols.last_preempted[:n], cols.start[:n]) < sp
        )
        self.evictable = self.base & ~self.protected
        nt = cols.nt
        self.t_job = cols.t_job[:nt]
        self.t_ord = ctx.idx.ord_of_key[cols.t_node[:nt]]
        self.t_gpus = cols.t_gpus[:nt]

    def min_rank(self) -> float:
        return float(self.rank.min()) if self.n else float("inf")


def _sort_runs(order: np.ndarray, eq: np.ndarray, key: Callable[[int], Any]) -> None:
    """Sort each run of ``order`` whose entries ``eq`` marks equal (``eq[i]``: entry i + 1 equals entry i)
    by ``key`` of the slot, in place."""
    if not eq.any():
        return
    n = len(order)
    for a in np.flatnonzero(eq & ~np.r_[False, eq[:-1]]).tolist():
        b = a + 1
        while b < n - 1 and eq[b]:
            b += 1
        order[a : b + 1] = sorted(order[a : b + 1].tolist(), key=key)


def running_view(ctx: Ctx, orderer: Orderer) -> RunningView:
    v = ctx.cache.get("running_view")
    if v is None:
        v = ctx.cache["running_view"] = RunningView(ctx, orderer)
    return v  # type: ignore[return-value]


class Preemptor(Protocol):
    def plan(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, view: RunningView
    ) -> PreemptionPlan | None: ...


def job_tasks(ctx: Ctx, jid: str) -> tuple[tuple[int, int], ...]:
    """(node ordinal, GPU mask) of every task of running job ``jid``."""
    ord_of = ctx.idx.ord_of
    return tuple((ord_of[n], m) for n, m in ctx.cluster.job_masks[jid])


def drop_chosen(mask: np.ndarray, ctx: Ctx, view: RunningView) -> None:
    """Clear, in a per-slot mask of ``view``, the running jobs already chosen as victims or movers this
    cycle (or still stopping for an earlier preemptor)."""
    if ctx.preempted:
        slot = view.cols.slot
        gone = [slot[j] for j in ctx.preempted if j in slot]
        if gone:
            mask[gone] = False


class _Walk(NamedTuple):
    """What the domain walks of one ``RankPreemptor.plan`` call share."""

    job: PendingJob
    size: int
    gpu_type: str
    rank: float
    ctx: Ctx
    level: str
    required: str | None
    quota_aware: bool  # the plan must pass the preemptor's queue's quota with the victims' usage gone
    p_within: bool  # the preemptor fits within its queue's nominal quota (``RankPreemptor._within``)
    cand: Callable[[int], Candidate]  # candidate at a position of the cost order (shrinks first)


def _candidates(
    ctx: Ctx, view: RunningView, shrinks: list[Candidate], slots: np.ndarray, kinds: np.ndarray
) -> Callable[[int], Candidate]:
    """The candidate at position ``p`` of the cost order (shrinks first, then the eviction slots), built
    on first use and memoized."""
    ns = len(shrinks)
    cache: dict[int, Candidate] = {}
    cols = view.cols
    running = ctx.cluster.running

    def cand(p: int) -> Candidate:
        c = cache.get(p)
        if c is None:
            if p < ns:
                c = shrinks[p]
            else:
                s = int(slots[p - ns])
                jid = cols.ids[s]
                c = Candidate(
                    int(kinds[p - ns]), float(view.rank[s]), float(view.lost[s]), running[jid],
                    job_tasks(ctx, jid), (),
                )  # fmt: skip
            cache[p] = c
        return c

    return cand


class RankPreemptor:
    """Shrink > reclaim > preempt strictly lower rank; ``reason_name`` names the priority kind."""

    def __init__(
        self, reason_name: str = "priority", borrowers_only: bool = False, quota_aware: bool = False
    ) -> None:
        self.reason_name = reason_name
        self._quota_aware = quota_aware and borrowers_only
        # rallypoint: a victim of another queue must be borrowing and its queue must stay at or above
        # its nominal once the victim is gone (so no guaranteed share is taken, and the victim, whose
        # queue still borrows, is ordered after its preemptor next cycle); reclaim ignores the start /
        # preemption protection; priority victims of the same class (kind 3, "las") rank by attained
        # service. Without it: the classic rule (any lower rank; reclaim may overshoot to below nominal).
        self.borrowers_only = borrowers_only

    @property
    def quota_aware(self) -> bool:
        """The engine may ask this preemptor to make quota room for a QuotaExceeded job."""
        return self._quota_aware

    # --- candidates ------------------------------------------------------------------------------

    @staticmethod
    def _shrinks(job: PendingJob, gpu_type: str, rank: float, ctx: Ctx, view: RunningView) -> list[Candidate]:
        """Elastic gangs above their minimum, rank not above the preemptor's: one candidate per step, from
        the last tasks backwards, so a shrink takes only what the preemptor needs."""
        if not ctx.cfg.elastic:
            return []
        cols = view.cols
        n = view.n
        tid = cols.gtypes.ids.get(gpu_type)
        if tid is None:
            return []
        sel = np.flatnonzero(cols.elastic[:n] & (cols.gtype[:n] == tid) & (view.rank <= rank))
        out: list[Candidate] = []
        for s in sel.tolist():
            jid = cols.ids[s]
            if jid in ctx.preempted:
                continue
            rj = ctx.cluster.running[jid]
            assert rj.min_gpus is not None
            masks = job_tasks(ctx, jid)
            step = rj.gpu_step or rj.gpus_per_task or (rj.gpus // max(1, len(rj.placements)))
            gpt = rj.gpus_per_task or max(1, rj.gpus // max(1, len(rj.placements)))
            chunks = (rj.gpus - rj.min_gpus) // step
            per = step // gpt if step % gpt == 0 else 0
            k = len(masks)
            rr = float(view.rank[s])
            for i in range(chunks if per else 0):
                lo, hi = k - (i + 1) * per, k - i * per
                if lo < 0:
                    break
                out.append(Candidate(0, rr, 0.0, rj, masks[lo:hi], tuple(range(lo, hi)), i))
        out.sort(key=lambda c: (c.rank, -c.gpus, c.job.id, c.seq))
        return out

    @staticmethod
    def _remaining_borrow(ctx: Ctx, queue: str, gpu_type: str) -> int:
        """What ``queue`` still borrows once the victims already chosen from it are gone, in thousandths of
        a GPU (``core.units``)."""
        if not ctx.quota.limited(queue):
            return 0
        used = ctx.ws.usage.get((queue, gpu_type), 0) - ctx.evicted.get((queue, gpu_type), 0)
        return used - ctx.quota.nominal(queue, gpu_type)

    def _left(self, ctx: Ctx, queue: str, gpu_type: str, taken: dict[str, int], quota_aware: bool) -> int:
        """What ``queue`` still borrows (thousandths) once a plan's victims so far (``taken``) are gone. With
        ``quota_aware`` the workspace usage already went down by them: counting them again stopped
        reclaim halfway, leaving the reclaiming queue below its nominal."""
        rb = self._remaining_borrow(ctx, queue, gpu_type)
        return rb if quota_aware else rb - taken.get(queue, 0)

    def _within(self, job: PendingJob, size: int, gpu_type: str, ctx: Ctx) -> bool:
        """The preemptor's queue fits it within its nominal quota: it may reclaim borrowed quota.

        With ``borrowers_only`` the test is made at ``guaranteed_gpus`` (an elastic gang's minimum, else
        its request) when the plan is smaller: that is ``ClassLasOrder.tier``'s test, and a reclaim is only
        fruitful if the preemptor is ordered (tier 0) before the borrowers it evicts once they wait again.
        When the reclaim measured an elastic job at its minimum while the tier measured its request, a job
        in tier 1 evicted a borrower, the borrower (tier 1 too, less work left) was re-admitted first into
        the freed GPUs, and the job reclaimed again, at every cycle (the livelock in docs/simulator.md)."""
        gpus = max(size, guaranteed_gpus(job, ctx.cfg.elastic)) if self.borrowers_only else size
        return ctx.quota.within_nominal(ctx.ws, job.queue_name, gpu_type, gpus * GPU_MILLI)

    def eligible(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, view: RunningView
    ) -> list[str]:
        """The running jobs this preemptor may evict for ``job`` (reclaim, then priority and same-class
        candidates, each in cost order), by id: what a planner with its own placement walks
        (``rule_preemption``)."""
        slots, _kinds = self._evictions(job, size, gpu_type, rank, ctx, view)
        ids = view.cols.ids
        return [ids[s] for s in slots.tolist()]

    def _evictions(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, view: RunningView
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slots of evictable candidates in cost order and their kinds (1 reclaim, 2 priority)."""
        cols = view.cols
        n = view.n
        tid = cols.gtypes.ids.get(gpu_type)
        if tid is None or n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        avail = view.evictable & (cols.gtype[:n] == tid)
        drop_chosen(avail, ctx, view)
        if self.borrowers_only:
            return self._borrower_evictions(job, size, gpu_type, rank, ctx, view, tid)
        reclaim = np.zeros(n, np.bool_)
        if ctx.quota.within_nominal(ctx.ws, job.queue_name, gpu_type, size * GPU_MILLI):
            lut = np.array(
                [self._remaining_borrow(ctx, q, gpu_type) > 0 for q in cols.queues.names] or [False], np.bool_
            )
            reclaim = avail & lut[cols.queue[:n]]
        prio = avail & (view.rank < rank) & ~reclaim
        order = view.order
        r_slots = order[reclaim[order]]
        p_slots = order[prio[order]]
        slots = np.concatenate((r_slots, p_slots))
        kinds = np.concatenate((np.full(len(r_slots), 1, np.int64), np.full(len(p_slots), 2, np.int64)))
        return slots, kinds

    def _borrower_evictions(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, view: RunningView, tid: int
    ) -> tuple[np.ndarray, np.ndarray]:
        cols = view.cols
        n = view.n
        base = view.base & (cols.gtype[:n] == tid)
        drop_chosen(base, ctx, view)
        milli = cols.gpus[:n] * GPU_MILLI  # whole-GPU victims' quota (shares and slices are never here)
        qid = cols.queue[:n]
        # what each queue borrows beyond what is already being evicted from it (thousandths)
        borrow = np.array(
            [self._remaining_borrow(ctx, q, gpu_type) for q in cols.queues.names] or [0], np.int64
        )[qid]
        limited = np.array([ctx.quota.limited(q) for q in cols.queues.names] or [False], np.bool_)[qid]
        # the victim's queue stays at or above nominal without it (or has no quota at all)
        keeps_nominal = (borrow >= milli) | ~limited
        own = cols.queues.ids.get(job.queue_name, -1)
        reclaim = np.zeros(n, np.bool_)
        within = self._within(job, size, gpu_type, ctx)
        if within:
            reclaim = base & (borrow > 0)  # reclaim stops at nominal (may overshoot by one victim)
        # another queue's victim: its queue must stay at or above nominal (no guaranteed share is taken);
        # an own-queue victim: the queue must borrow now or the preemptor fit in nominal, else the victim
        # would be ordered ahead of its preemptor next cycle (tier 0) and take its GPUs back
        ok_queue = keeps_nominal | ((qid == own) & (within | (borrow > 0)))
        lower = (view.rank < rank) & base & ~view.protected & ~reclaim & ok_queue
        cls_v = class_rank_array(cols, ctx)
        p_cls = ctx.prio_of(job)
        prio = lower & (cls_v < p_cls)
        las = lower & (cls_v == p_cls) & ~view.protected_las
        order = view.order
        parts = [order[m[order]] for m in (reclaim, prio, las)]
        slots = np.concatenate(parts)
        kinds = np.concatenate([np.full(len(p), k, np.int64) for p, k in zip(parts, (1, 2, 3), strict=True)])
        return slots, kinds

    # --- planning --------------------------------------------------------------------------------

    def plan(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, view: RunningView
    ) -> PreemptionPlan | None:
        """Stages: candidates (``_shrinks``, ``_evictions``) -> the domain level (``_domain_level``) ->
        the vectorized domain walk (``_walk_entries``, ``_estimates``) -> per estimated domain, cheapest
        first: free its victims on the workspace (``_domain_candidates``, ``_free_victims``), prune
        (``_prune``), roll back -> the cheapest verified plan."""
        required = ctx.required_level(job)
        level = self._domain_level(ctx, gpu_type, required, size)
        shrinks = self._shrinks(job, gpu_type, rank, ctx, view)
        slots, kinds = self._evictions(job, size, gpu_type, rank, ctx, view)
        if not shrinks and len(slots) == 0:
            return None
        entries = self._walk_entries(ctx, view, level, shrinks, slots)
        if entries is None:
            return None
        e_d, e_p, e_g = entries
        estimates = self._estimates(
            ctx, view, level, gpu_type, size, e_d, e_p, e_g, len(shrinks), slots, kinds
        )
        if not estimates:
            return None
        w = _Walk(
            job, size, gpu_type, rank, ctx, level, required,
            # rallypoint: the gang must also pass its queue's quota once the victims' usage is gone (a job
            # of a borrowing queue may evict its own queue's lower-ranked jobs or other borrowers)
            self._quota_aware and ctx.quota.limited(job.queue_name),
            self._within(job, size, gpu_type, ctx),
            _candidates(ctx, view, shrinks, slots, kinds),
        )  # fmt: skip
        ws = ctx.ws
        best: PreemptionPlan | None = None
        best_key: tuple[int, int, float] | None = None
        for worst, n, lost, d, a, b, e in estimates[:_VERIFY_DOMAINS]:
            per_dom, n_prefix = self._domain_candidates(e_p, e_g, a, b, e)
            mark = ws.mark()
            plan, chosen = self._free_victims(w, d, per_dom, n_prefix)
            if plan is not None:
                raw_key = (max(c.kind for c in chosen), len(chosen), sum(c.lost for c in chosen))
                plan, chosen = self._prune(
                    plan, chosen, size // job.gpus_per_task, job.gpus_per_task, gpu_type, required, ctx,
                    job if w.quota_aware else None,
                )  # fmt: skip
            else:
                raw_key = None
            ws.rollback(mark)
            if plan is None:
                continue
            key = (max(c.kind for c in chosen), len(chosen), sum(c.lost for c in chosen))
            if best_key is None or key < best_key:
                best_key = key
                best = PreemptionPlan(tuple(chosen), plan)
            if (worst, n, lost) == raw_key:
                break  # the estimate was exact and estimates are sorted: nothing cheaper follows
        return best

    @staticmethod
    def _domain_level(ctx: Ctx, gpu_type: str, required: str | None, size: int) -> str:
        """The lowest topology level (not above ``required``) one domain of which can hold the gang when
        healthy: victims are grouped by its domains."""
        for lv in LEVELS[1:]:
            if level_rank(lv) > level_rank(required):
                break
            if ctx.healthy_capacity(gpu_type, lv) >= size:
                return lv
        return "cluster"

    @staticmethod
    def _walk_entries(
        ctx: Ctx, view: RunningView, level: str, shrinks: list[Candidate], slots: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """One entry per candidate task, sorted by (domain, candidate position): its domain at ``level``,
        its candidate's position in cost order (shrinks first) and its GPUs. None when there is none."""
        idx = ctx.idx
        ns = len(shrinks)
        pos = np.full(view.n, -1, np.int64)
        pos[slots] = np.arange(ns, ns + len(slots), dtype=np.int64)
        tp = pos[view.t_job]
        sel = tp >= 0
        e_p = tp[sel]
        e_o = view.t_ord[sel]
        e_g = view.t_gpus[sel]
        if shrinks:
            sp = [i for i, c in enumerate(shrinks) for _t in c.tasks]
            so = [o for c in shrinks for o, _m in c.tasks]
            sg = [m.bit_count() for c in shrinks for _o, m in c.tasks]
            e_p = np.concatenate((np.asarray(sp, np.int64), e_p))
            e_o = np.concatenate((np.asarray(so, np.int64), e_o))
            e_g = np.concatenate((np.asarray(sg, np.int64), e_g))
        if level == "node":
            e_d = e_o
        elif level == "rack":
            e_d = idx.rack_of_np[e_o]
        elif level == "spine":
            e_d = idx.spine_of_np[e_o]
        else:
            e_d = np.zeros(len(e_o), np.int64)
        m = len(e_d)
        if m == 0:
            return None
        # order by (domain, candidate position), ties in entry order: np.lexsort((e_p, e_d)), done as one
        # plain sort of unique int64 keys (several times faster than the two-key indirect sort)
        span_p = int(e_p.max()) + 1
        if (int(e_d.max()) + 1) * span_p * m < 1 << 62:
            k = np.sort((e_d * span_p + e_p) * m + np.arange(m, dtype=np.int64)) % m
        else:
            k = np.lexsort((e_p, e_d))
        return e_d[k], e_p[k], e_g[k]

    def _estimates(
        self,
        ctx: Ctx,
        view: RunningView,
        level: str,
        gpu_type: str,
        size: int,
        e_d: np.ndarray,
        e_p: np.ndarray,
        e_g: np.ndarray,
        ns: int,
        slots: np.ndarray,
        kinds: np.ndarray,
    ) -> list[tuple[int, int, float, int, int, int, int]]:
        """The domains to verify, cheapest estimate first. A domain's estimate is its candidates up to the
        one whose GPUs (plus the domain's free GPUs) first reach the gang's size; the domains that complete
        by the time the ``_VERIFY_DOMAINS``-th one does are estimated. Each: (worst kind, victims, work
        lost, domain, its first entry, the entry after the completing victim, the entry after the
        domain)."""
        m = len(e_d)
        newgrp = np.r_[True, e_d[1:] != e_d[:-1]]
        grp_start = np.flatnonzero(newgrp)
        grp_id = np.cumsum(newgrp) - 1
        doms = e_d[grp_start].tolist()
        free0 = self._free_per_domain(ctx, level, e_d[grp_start], gpu_type)
        cs = np.cumsum(e_g)
        before = np.r_[0, cs[:-1]][grp_start]
        have = free0[grp_id] + cs - before[grp_id]
        complete = (have >= size) & (free0[grp_id] < size)
        ce = np.flatnonzero(complete)
        if len(ce) == 0:
            return []
        # first completing entry per domain
        cg, first = np.unique(grp_id[ce], return_index=True)
        comp_entry = ce[first]
        comp_p = e_p[comp_entry]
        # the domains that complete by the time the _VERIFY_DOMAINS-th one does (walk order)
        ps = np.sort(comp_p)
        cut = ps[min(_VERIFY_DOMAINS, len(ps)) - 1]
        chosen_g = np.flatnonzero(comp_p <= cut)
        lost_p = np.zeros(ns + len(slots), np.float64)
        kind_p = np.zeros(ns + len(slots), np.int64)
        if len(slots):
            lost_p[ns:] = view.lost[slots]
            kind_p[ns:] = kinds
        grp_end = np.r_[grp_start[1:], m]
        estimates: list[tuple[int, int, float, int, int, int, int]] = []
        for gi in chosen_g.tolist():
            g = int(cg[gi])
            a = int(grp_start[g])
            b = int(comp_entry[gi]) + 1
            end = int(grp_end[g])
            while b < end and e_p[b] == e_p[b - 1]:
                b += 1  # all of the completing victim's tasks in the domain (task row order is history)
            ps_d = e_p[a:b]
            uniq = np.unique(ps_d)  # one victim may have several tasks in the domain
            estimates.append(
                (
                    int(kind_p[uniq].max()), len(uniq), float(lost_p[uniq].sum()), int(doms[g]), a, b,
                    end,
                )
            )  # fmt: skip
        estimates.sort()
        return estimates

    @staticmethod
    def _domain_candidates(
        e_p: np.ndarray, e_g: np.ndarray, a: int, b: int, e: int
    ) -> tuple[list[tuple[int, int]], int]:
        """Candidates of one domain in walk order, with the GPUs each frees inside it, and how many form
        the estimate's prefix. The rest of the domain is used when the reclaim stop rule skipped a victim
        the estimate counted on, or when the prefix frees enough GPUs but not in the gang's shape (a count
        is not whole nodes: a 2 x 8-GPU gang in a rack needs two nodes emptied)."""
        per_dom: list[tuple[int, int]] = []
        n_prefix = 0
        for i, (p, g) in enumerate(zip(e_p[a:e].tolist(), e_g[a:e].tolist(), strict=True)):
            if per_dom and per_dom[-1][0] == p:
                per_dom[-1] = (p, per_dom[-1][1] + g)
            else:
                per_dom.append((p, g))
            if a + i < b:
                n_prefix = len(per_dom)
        return per_dom, n_prefix

    def _free_victims(
        self, w: _Walk, d: int, per_dom: list[tuple[int, int]], n_prefix: int
    ) -> tuple[Plan | None, list[Candidate]]:
        """Free domain ``d``'s candidates in walk order on the workspace (the caller rolls back) until the
        gang places (and, quota-aware, its queue admits it), skipping those the reclaim stop rule and the
        borrowers-only rule refuse. Returns (the plan or None, the victims freed)."""
        ctx, job, size, gpu_type, rank = w.ctx, w.job, w.size, w.gpu_type, w.rank
        quota_aware = w.quota_aware
        ws = ctx.ws
        gpt = job.gpus_per_task
        stopped = False
        chosen: list[Candidate] = []
        plan: Plan | None = None
        kinds_of: dict[str, int] = {}
        taken: dict[str, int] = {}  # GPU thousandths evicted from each queue by this plan (reclaim stop rule)
        got = self._free_in(ctx, w.level, d, gpu_type)
        check_at = size
        for i, (p, g) in enumerate(per_dom):
            if i >= n_prefix and not stopped and got >= 2 * size:
                break  # past the estimate, the walk frees at most about one more gang's worth
            c = w.cand(p)
            if self.borrowers_only and c.kind > 1:
                q = c.job.queue_name
                left = self._left(ctx, q, gpu_type, taken, quota_aware)
                # own queue: it must still borrow (or the preemptor fit in nominal), so the victim is
                # not ordered ahead of its preemptor next cycle
                short = (not w.p_within and left <= 0) if q == job.queue_name else left < c.gpus * GPU_MILLI
                if ctx.quota.limited(q) and short:
                    stopped = True  # its queue would drop below nominal: not a victim
                    continue
            if c.kind == 1:
                q = c.job.queue_name
                if self._left(ctx, q, gpu_type, taken, quota_aware) <= 0:
                    # the queue is back at its nominal: no more reclaiming from it; a job that also
                    # ranks strictly lower may still go as a priority victim
                    stopped = True
                    if c.rank >= rank or self.borrowers_only:
                        continue  # (borrowers_only: its queue is at nominal, no victim of another queue)
                    c = c._replace(kind=2)
            if kinds_of.setdefault(c.job.id, c.kind) != c.kind:
                continue  # never both shrink and evict one job
            q = c.job.queue_name
            taken[q] = taken.get(q, 0) + sum(mk.bit_count() for _o, mk in c.tasks) * GPU_MILLI
            for o, mk in c.tasks:
                ws.give(o, mk)
            if quota_aware:
                ws.add_usage(q, gpu_type, -c.gpus * GPU_MILLI)  # journaled: the victim's quota use goes too
            chosen.append(c)
            got += g
            # a placement check costs up to a cluster scan: check once the domain can hold the gang,
            # then again only after another eighth of the gang has been freed
            if got >= check_at and ws.type_free.get(gpu_type, 0) >= size:
                plan = place(ws, size // gpt, gpt, gpu_type, w.required, ctx.cfg.first_fit)
                if plan is not None:
                    if (
                        not quota_aware
                        or ctx.quota.check(ws, job.queue_name, gpu_type, size * GPU_MILLI) is None
                    ):
                        break
                    plan = None  # fits, but its queue may not take it yet: free more quota
                    stopped = True
                check_at = got + max(gpt, size // 8)
        return plan, chosen

    @staticmethod
    def _prune(
        plan: Plan,
        chosen: list[Candidate],
        tasks: int,
        gpt: int,
        gpu_type: str,
        required: str | None,
        ctx: Ctx,
        quota_job: PendingJob | None = None,
    ) -> tuple[Plan, list[Candidate]]:
        """Drop victims the gang does not need: most expensive first, put a victim's GPUs back and keep
        the removal when the gang still fits (victims were added in cost order, so the last ones often
        only topped up a domain that earlier ones had already made big enough)."""
        w = ctx.ws
        keep = list(chosen)
        used: dict[int, int] | None = None  # GPUs of the current plan per node (rebuilt when it changes)
        for c in sorted(chosen, key=Candidate.cost, reverse=True):
            if len(keep) == 1:
                break
            if used is None:
                used = {}
                for o, mk in plan.tasks:
                    used[o] = used.get(o, 0) | mk
            if quota_job is not None:
                # the victim's quota use comes back too: keep the removal only if the queue still admits
                mark = w.mark()
                w.add_usage(c.job.queue_name, gpu_type, c.gpus * GPU_MILLI)
                if ctx.quota.check(w, quota_job.queue_name, gpu_type, tasks * gpt * GPU_MILLI) is not None:
                    w.rollback(mark)
                    continue
                w.rollback(mark)
            if not any(used.get(o, 0) & mk for o, mk in c.tasks):
                # the current plan does not touch this victim's GPUs: it fits without it, no search needed
                for o, mk in c.tasks:
                    w.take(o, mk)
                if quota_job is not None:
                    w.add_usage(c.job.queue_name, gpu_type, c.gpus * GPU_MILLI)
                keep.remove(c)
                continue
            mark = w.mark()
            for o, mk in c.tasks:
                w.take(o, mk)
            if quota_job is not None:
                w.add_usage(c.job.queue_name, gpu_type, c.gpus * GPU_MILLI)
            p = place(w, tasks, gpt, gpu_type, required, ctx.cfg.first_fit)
            if p is None:
                w.rollback(mark)
            else:
                if p != plan:
                    used = None
                plan = p
                keep.remove(c)
        return plan, keep

    @staticmethod
    def _free_per_domain(ctx: Ctx, level: str, doms: np.ndarray, gpu_type: str) -> np.ndarray:
        """``_free_in`` for many domains at once, from the workspace's per-node free counts."""
        ws = ctx.ws
        idx = ctx.idx
        fc = np.frombuffer(ws.fcount, np.uint16)
        if level == "node":
            return fc[doms].astype(np.int64)  # any type: a node-level domain is one node
        if level not in ("rack", "spine"):
            return np.full(len(doms), ws.type_free.get(gpu_type, 0), np.int64)
        of = idx.rack_of_np if level == "rack" else idx.spine_of_np
        n = len(idx.racks) if level == "rack" else len(idx.spines)
        if len(idx.types) == 1 and gpu_type == idx.types[0]:
            return np.bincount(of, weights=fc, minlength=n).astype(np.int64)[doms]
        is_t = idx.type_np == (idx.types.index(gpu_type) if gpu_type in idx.types else -1)
        out = np.bincount(of, weights=np.where(is_t, fc, 0), minlength=n).astype(np.int64)
        # like ``_free_in``: a domain without any node of the type reads the type's free total
        out[np.bincount(of, weights=is_t, minlength=n) == 0] = ws.type_free.get(gpu_type, 0)
        return out[doms]

    @staticmethod
    def _free_in(ctx: Ctx, level: str, d: int, gpu_type: str) -> int:
        ws = ctx.ws
        if level == "node":
            return ws.free[d].bit_count() if ws.sched[d] else 0
        hist = (
            (ws.rack_hist if level == "rack" else ws.spine_hist).get((gpu_type, d))
            if level in ("rack", "spine")
            else None
        )
        if hist is not None:
            return sum(map(mul, hist, range(len(hist))))  # sum of c * nodes with c free (c = 0 adds 0)
        return ws.type_free.get(gpu_type, 0)
