"""Least-disruptive preemption: shrink elastic gangs, then reclaim borrowed quota, then preempt by rank.

Order of actions (KAI: allocate > consolidate > reclaim > preempt): the engine has already tried to
allocate; here candidates are, cheapest first,

1. *shrink*: elastic running gangs above their minimum whose rank is not above the preemptor's;
2. *reclaim*: jobs of queues borrowing above nominal, when the preemptor's queue is within its nominal
   (the only case where equal or higher priority may be evicted: guaranteed quota comes back);
3. *priority*: jobs of strictly lower rank (class value; LAS: attained-service queue).

Never: non-preemptible jobs or classes, jobs preempted less than ``preemption_protection_s`` ago, jobs
already chosen this cycle. Victims are grouped by the topology domain the preemptor needs (node / rack /
spine / cluster); per domain a greedy pick by (kind, rank, GPU-seconds lost since last checkpoint, fewest
victims) is estimated, the best few domains are verified with a real placement on the workspace
(journaled and rolled back), and the cheapest verified plan wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Protocol

from rallypoint.core.context import Ctx
from rallypoint.core.placement import LEVELS, Plan, level_rank, place
from rallypoint.core.types import PendingJob, RunningJob

__all__ = ["Candidate", "PreemptionPlan", "Preemptor", "RankPreemptor"]

_VERIFY_DOMAINS = 4


class Candidate(NamedTuple):
    kind: int  # 0 shrink, 1 reclaim, 2 priority
    rank: float
    lost: float  # GPU-seconds of work lost since the last checkpoint
    job: RunningJob
    tasks: tuple[tuple[int, int], ...]  # (ordinal, mask) freed
    remove: tuple[int, ...]  # task indices removed by a shrink (empty for an eviction)
    seq: int = 0  # shrink chunks of one job: the last tasks go first

    @property
    def reason(self) -> str:
        return ("shrink", "reclaim", "priority")[self.kind]

    @property
    def gpus(self) -> int:
        return sum(m.bit_count() for _o, m in self.tasks)


class PreemptionPlan(NamedTuple):
    victims: tuple[Candidate, ...]
    plan: Plan


class Preemptor(Protocol):
    def plan(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, running_rank: dict[str, float]
    ) -> PreemptionPlan | None: ...


class RankPreemptor:
    """Shrink > reclaim > preempt strictly lower rank; ``reason_name`` names the priority kind."""

    def __init__(self, reason_name: str = "priority") -> None:
        self.reason_name = reason_name

    @staticmethod
    def _rows(
        ctx: Ctx, running_rank: dict[str, float]
    ) -> list[tuple[float, float, int, str, RunningJob, tuple[tuple[int, int], ...], str]]:
        """Running jobs with their masks and cost parts, sorted by (rank, work lost, -GPUs, id); built once
        per cycle, so several preemptors in one cycle share the O(running jobs) work."""
        cached = ctx.cache.get("preempt_rows")
        if cached is not None:
            return cached  # type: ignore[return-value]
        cl = ctx.cluster
        ord_of = ctx.idx.ord_of
        now = ctx.now
        rows: list[tuple[float, float, int, str, RunningJob, tuple[tuple[int, int], ...], str]] = []
        for jid, rj in cl.running.items():
            since = rj.last_checkpoint if rj.last_checkpoint is not None else rj.start_time
            rows.append(
                (
                    running_rank[jid],
                    rj.gpus * max(0.0, now - since),
                    -rj.gpus,
                    jid,
                    rj,
                    tuple((ord_of[n], m) for n, m in cl.job_masks[jid]),
                    cl.job_gpu_type(rj),
                )
            )
        rows.sort(key=lambda r: r[:4])
        ctx.cache["preempt_rows"] = rows
        return rows

    def candidates(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, running_rank: dict[str, float]
    ) -> Iterator[Candidate]:
        """Candidates lazily, cheapest first: shrinks, then reclaims, then strictly lower ranks. Lazy so
        that a preemptor satisfied by its first few victims never walks every running job."""
        cfg = ctx.cfg
        rows = self._rows(ctx, running_rank)
        reclaim_ok = ctx.quota.within_nominal(ctx.ws, job.queue_name, gpu_type, size)
        protect = cfg.preemption_protection_s

        def evictable(rj: RunningJob) -> bool:
            if not rj.preemptible or not ctx.class_preemptible.get(rj.priority_class, True):
                return False
            return rj.last_preempted_at is None or ctx.now - rj.last_preempted_at >= protect

        if cfg.elastic:
            shrinks: list[Candidate] = []
            for rr, _lost, _ng, jid, rj, masks, gt in rows:
                if rr > rank:
                    break
                if rj.min_gpus is None or rj.gpus <= rj.min_gpus or gt != gpu_type or jid in ctx.preempted:
                    continue
                step = rj.gpu_step or rj.gpus_per_task or (rj.gpus // max(1, len(rj.placements)))
                gpt = rj.gpus_per_task or max(1, rj.gpus // max(1, len(rj.placements)))
                chunks = (rj.gpus - rj.min_gpus) // step
                per = step // gpt if step % gpt == 0 else 0
                k = len(masks)
                # one candidate per step, from the last tasks backwards, so a shrink takes only what the
                # preemptor needs
                for i in range(chunks if per else 0):
                    lo, hi = k - (i + 1) * per, k - i * per
                    if lo < 0:
                        break
                    shrinks.append(Candidate(0, rr, 0.0, rj, masks[lo:hi], tuple(range(lo, hi)), i))
            shrinks.sort(key=lambda c: (c.rank, -c.gpus, c.job.id, c.seq))
            yield from shrinks
        if reclaim_ok:
            borrowing: dict[str, bool] = {}
            for rr, lost, _ng, jid, rj, masks, gt in rows:
                if gt != gpu_type or jid in ctx.preempted or not evictable(rj):
                    continue
                q = rj.queue_name
                b = borrowing.get(q)
                if b is None:
                    b = borrowing[q] = ctx.quota.borrowing(ctx.ws, q, gpu_type) > 0
                if b:
                    yield Candidate(1, rr, lost, rj, masks, ())
        for rr, lost, _ng, jid, rj, masks, gt in rows:
            if rr >= rank:
                break  # rows are sorted by rank: nothing further ranks lower
            if gt != gpu_type or jid in ctx.preempted or not evictable(rj):
                continue
            if reclaim_ok and ctx.quota.borrowing(ctx.ws, rj.queue_name, gpu_type) > 0:
                continue  # already offered as a reclaim
            yield Candidate(2, rr, lost, rj, masks, ())

    def plan(
        self, job: PendingJob, size: int, gpu_type: str, rank: float, ctx: Ctx, running_rank: dict[str, float]
    ) -> PreemptionPlan | None:
        cands = self.candidates(job, size, gpu_type, rank, ctx, running_rank)
        idx = ctx.idx
        ws = ctx.ws
        required = ctx.required_level(job)
        gpt = job.gpus_per_task
        tasks = size // gpt
        # the lowest level that can hold the gang when healthy
        level = "cluster"
        for lv in LEVELS[1:]:
            if level_rank(lv) > level_rank(required):
                break
            if ctx.healthy_capacity(gpu_type, lv) >= size:
                level = lv
                break

        def dom(o: int) -> int:
            if level == "node":
                return o
            if level == "rack":
                return idx.rack_of[o]
            if level == "spine":
                return idx.spine_of[o]
            return 0

        # Candidates arrive sorted by (kind, rank, work lost, -GPUs, id, chunk). Walk them in that order,
        # accumulating what each domain would free; the first domains to reach the gang's size are the
        # least disruptive ones (lowest kinds and ranks, least work lost). Stopping after a few complete
        # domains keeps this O(victims needed) instead of O(running jobs) for the common small preemptor.
        per_dom: dict[int, list[tuple[Candidate, int]]] = {}
        have: dict[int, int] = {}
        cost: dict[int, tuple[int, int, float]] = {}
        estimates: list[tuple[int, int, float, int]] = []
        for c in cands:
            freed: dict[int, int] = {}
            for o, m in c.tasks:
                d = dom(o)
                freed[d] = freed.get(d, 0) + m.bit_count()
            for d, g in freed.items():
                h = have.get(d)
                if h is None:
                    h = self._free_in(ctx, level, d, gpu_type)
                if h >= size:
                    continue  # already complete
                per_dom.setdefault(d, []).append((c, g))
                w, n, lost = cost.get(d, (0, 0, 0.0))
                cost[d] = (max(w, c.kind), n + 1, lost + c.lost)
                have[d] = h + g
                if h + g >= size:
                    estimates.append((*cost[d], d))
            if len(estimates) >= _VERIFY_DOMAINS:
                break
        free_in = {d: self._free_in(ctx, level, d, gpu_type) for d, _e in ((e[3], e) for e in estimates)}
        estimates.sort()
        best: PreemptionPlan | None = None
        best_key: tuple[int, int, float] | None = None
        for worst, n, lost, d in estimates[:_VERIFY_DOMAINS]:
            mark = ws.mark()
            chosen: list[Candidate] = []
            plan: Plan | None = None
            kinds: dict[str, int] = {}
            got = free_in[d]
            check_at = size
            for c, g in per_dom[d]:
                if kinds.setdefault(c.job.id, c.kind) != c.kind:
                    continue  # never both shrink and evict one job
                for o, m in c.tasks:
                    ws.give(o, m)
                chosen.append(c)
                got += g
                # a placement check costs up to a cluster scan: check once the domain can hold the gang,
                # then again only after another eighth of the gang has been freed
                if got >= check_at and ws.type_free.get(gpu_type, 0) >= size:
                    plan = place(ws, tasks, gpt, gpu_type, required, ctx.cfg.first_fit)
                    if plan is not None:
                        break
                    check_at = got + max(gpt, size // 8)
            ws.rollback(mark)
            if plan is None:
                continue
            key = (max(c.kind for c in chosen), len(chosen), sum(c.lost for c in chosen))
            if best_key is None or key < best_key:
                best_key = key
                best = PreemptionPlan(tuple(chosen), plan)
            if (worst, n, lost) == key:
                break  # the estimate was exact and estimates are sorted: nothing cheaper follows
        return best

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
            return sum(c * hist[c] for c in range(1, len(hist)))
        return ws.type_free.get(gpu_type, 0)
