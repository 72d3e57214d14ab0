"""The scheduling cycle: order -> filter -> permit (quota) -> place -> backfill / preempt / reserve -> reason.

``run_cycle`` is the body of :func:`rallypoint.core.schedule`. It reads the snapshot, works on a
:class:`Workspace` (never on the caller's ClusterModel) and returns :class:`Decisions`. Cost is
proportional to what can be scheduled: once no GPU of any type is free, the remaining jobs get their
reason without a placement search (the placement itself bails out on free counts in O(1), and failures
of a gang shape are memoized until something is released).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.core import reasons
from rallypoint.core.backfill import hold
from rallypoint.core.context import Ctx, Status
from rallypoint.core.placement import Plan
from rallypoint.core.types import (
    Bind,
    Decisions,
    PendingJob,
    PendingReason,
    Preemption,
    Reservation,
    Resize,
    TaskPlacement,
)

if TYPE_CHECKING:
    from rallypoint.core.policies import Policy
    from rallypoint.core.types import Snapshot

__all__ = ["run_cycle"]

_BITS: dict[int, tuple[int, ...]] = {}


def bits(mask: int) -> tuple[int, ...]:
    t = _BITS.get(mask)
    if t is None:
        t = _BITS[mask] = tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
    return t


class _Out:
    def __init__(self) -> None:
        self.binds: list[Bind] = []
        self.reservations: list[Reservation] = []
        self.preemptions: list[Preemption] = []
        self.resizes: list[Resize] = []
        self.pending: list[PendingReason] = []


def job_sizes(job: PendingJob, ctx: Ctx) -> list[int]:
    """Sizes to try, largest first: an elastic gang from max down to min in steps, else just ``gpus``."""
    if not ctx.cfg.elastic or job.min_gpus is None:
        return [job.gpus]
    hi = job.max_gpus if job.max_gpus is not None else job.gpus
    step = job.gpu_step or job.gpus_per_task
    out = []
    s = hi
    while s >= job.min_gpus:
        if s % job.gpus_per_task == 0:
            out.append(s)
        s -= step
    return out or [job.gpus]


def _bind(job: PendingJob, size: int, plan: Plan, ctx: Ctx, out: _Out) -> None:
    ws = ctx.ws
    for o, m in plan.tasks:
        ws.take(o, m)
    ws.add_usage(job.queue_name, plan.gpu_type, size)
    g, c, mem = ctx.team_usage.get(job.team, (0, 0, 0))
    ctx.team_usage[job.team] = (g + size, c + job.cpu_milli, mem + job.memory_mib)
    ids = ctx.idx.ids
    out.binds.append(
        Bind(
            job_id=job.id,
            gpus=size,
            placements=tuple(
                TaskPlacement(task=i, node_id=ids[o], gpus=bits(m)) for i, (o, m) in enumerate(plan.tasks)
            ),
        )
    )
    rt = job.runtime_estimate
    if rt is not None:
        ctx.cycle_ends.append((ctx.now + rt, job.id, plan.tasks))


def _try_place(job: PendingJob, size: int, gpu_type: str | None, ctx: Ctx) -> Plan | None:
    """Place around held GPUs; a job that ends before every hold's shadow time may also use them."""
    tasks = size // job.gpus_per_task
    required = ctx.required_level(job)
    plan = ctx.place(tasks, job.gpus_per_task, gpu_type, required)
    if plan is not None or not ctx.holds:
        return plan
    rt = job.runtime_estimate
    if rt is None or ctx.now + rt > ctx.held_until():
        return None
    ws = ctx.ws
    mark = ws.mark()
    for h in ctx.holds:
        for o, m in h.tasks:
            ws.give(o, m)
    plan = ctx.place(tasks, job.gpus_per_task, gpu_type, required)
    ws.rollback(mark)
    return plan


def _attempt(job: PendingJob, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    """Try to bind ``job``. None when bound, else the status explaining why not."""
    for f in policy.filters:
        st = f.check(job, ctx)
        if st is not None:
            return st
    types = ctx.idx.types if job.gpu_type is None else [job.gpu_type]
    quota_msg: str | None = None
    sizes = job_sizes(job, ctx)
    for size in sizes:
        for t in types:
            msg = policy.permit.check(job, t, size, ctx)
            if msg is not None:
                quota_msg = quota_msg or msg
                continue
            plan = _try_place(job, size, t, ctx)
            if plan is not None:
                _bind(job, size, plan, ctx, out)
                return None
    size = sizes[-1]
    if quota_msg is not None and all(policy.permit.check(job, t, size, ctx) is not None for t in types):
        return Status("QuotaExceeded", quota_msg)
    st = reasons.classify(job, size, ctx)
    if st.code in ("Resources", "Topology", "Reservation"):
        pst = _preempt(job, size, policy, ctx, out)
        if pst is not None:
            return pst
        rst = _reserve(job, size, st, policy, ctx, out)
        if rst is not None:
            return rst
    return st


def _preempt(job: PendingJob, size: int, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    pre = policy.preemptor
    if pre is None or ctx.preemptors >= ctx.cfg.max_preemptors_per_cycle:
        return None
    rank = policy.orderer.rank(job, ctx)
    rr = ctx.running_ranks(policy.orderer)
    types = ctx.idx.types if job.gpu_type is None else [job.gpu_type]
    for t in types:
        if not ctx.quota.within_nominal(ctx.ws, job.queue_name, t, size) and (
            not rr or min(rr.values()) >= rank
        ):
            continue  # nothing ranks lower and no guaranteed quota to reclaim: skip the scan
        ctx.preemptors += 1
        pp = pre.plan(job, size, t, rank, ctx, rr)
        if pp is None:
            continue
        until = ctx.now + ctx.cfg.preemption_grace_s
        shrink: dict[str, list[int]] = {}
        for c in pp.victims:
            if c.kind == 0:
                shrink.setdefault(c.job.id, []).extend(c.remove)
            else:
                out.preemptions.append(
                    Preemption(victim_id=c.job.id, reason=policy.reason_for(c.reason), for_job=job.id)
                )
            ctx.preempted[c.job.id] = job.id
        for jid in sorted(shrink):
            rj = ctx.cluster.running[jid]
            rm = sorted(shrink[jid])
            removed = tuple(rj.placements[i] for i in rm)
            out.resizes.append(
                Resize(
                    job_id=jid,
                    gpus=rj.gpus - sum(len(p.gpus) for p in removed),
                    remove=removed,
                    reason=f"shrink for {job.id}",
                )
            )
        h = hold(ctx, job.id, until, pp.plan)
        nodes = tuple(sorted({ctx.idx.ids[o] for o, _m in pp.plan.tasks}))
        out.reservations.append(Reservation(job_id=job.id, start_estimate=until, nodes=nodes))
        del h
        n = len(pp.victims)
        return Status(
            "Preempting",
            f"needs {size} GPUs; preempting {n} job{'s' if n != 1 else ''} "
            f"({', '.join(c.job.id for c in pp.victims)}); start in ~{reasons.human(until - ctx.now)}",
            until,
        )
    return None


def _reserve(job: PendingJob, size: int, st: Status, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    r = policy.reserver
    if r is None:
        return None
    h = r.reserve(job, size, job.gpu_type, ctx)
    if h is None:
        return None
    nodes = tuple(sorted({ctx.idx.ids[o] for o, _m in h.tasks}))
    out.reservations.append(Reservation(job_id=job.id, start_estimate=h.until, nodes=nodes))
    return Status(
        st.code, st.message + f"; reserved, earliest start in ~{reasons.human(h.until - ctx.now)}", h.until
    )


def run_cycle(snapshot: Snapshot, policy: Policy) -> Decisions:
    ctx = Ctx(snapshot, policy.config)
    out = _Out()
    waiting = 0
    head: PendingJob | None = None
    for job in policy.orderer.order(snapshot.pending, ctx):
        if head is not None:
            out.pending.append(
                PendingReason(
                    job_id=job.id,
                    code="Priority",
                    message=f"waits behind head-of-line job {head.id}; {waiting} jobs ahead",
                    position=waiting,
                )
            )
            waiting += 1
            continue
        st = _attempt(job, policy, ctx, out)
        if st is None:
            continue
        msg = st.message + f"; {waiting} job{'s' if waiting != 1 else ''} ahead"
        out.pending.append(
            PendingReason(
                job_id=job.id, code=st.code, message=msg, position=waiting, earliest_start=st.earliest_start
            )
        )
        waiting += 1
        if policy.config.stop_at_first_block:
            head = job
    if policy.grower is not None:
        out.resizes.extend(policy.grower.grow(ctx, out.pending))
    return Decisions(
        policy=policy.name,
        now=snapshot.now,
        binds=tuple(out.binds),
        reservations=tuple(out.reservations),
        preemptions=tuple(out.preemptions),
        resizes=tuple(out.resizes),
        pending=tuple(out.pending),
    )
