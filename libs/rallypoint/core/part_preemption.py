"""Preemption where GPU shares and MIG slices are involved (``core.sharing``).

The whole-GPU planner (``core.preemption``) never picks a fractional or MIG job: evicting one share frees
no whole GPU while another share runs, and its numpy rows count GPUs, not parts of them. This module makes
room with them instead, under the same rules as that planner's priority preemption: a victim ranks strictly
below the preemptor (the policy's order), its class and the job are preemptible, it is not stopping already
and not protected by a recent preemption.

- **A fractional job** evicts, on one shared GPU, the lowest-ranked shares until its own fits; the GPU needing
  the fewest victims wins (then the least work lost, then topology order).
- **A MIG job** evicts, on one MIG GPU, exactly the slices overlapping one placement of its profile; the
  placement with the fewest victims wins (then work lost, topology order, lowest start).
- **A whole-GPU gang** may count on shared GPUs whose every share it outranks: the normal placement runs with
  those GPUs given back (a transaction, rolled back), and the shares on the GPUs it chose are evicted. Its
  hold is strict, as the planner's, and holds those GPUs again each cycle while their shares stop
  (``shares_stopping_for``).

The preemptor of a share or slice holds nothing while its victims stop: in the next cycles it waits with
``Preempting`` (no new victims) and takes the room as it frees, ahead of every job it outranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.core.cluster import GPU_MILLI
from rallypoint.core.context import Status
from rallypoint.core.mig import mig_model
from rallypoint.core.placement import Plan, bits, place
from rallypoint.core.preemption import running_view
from rallypoint.core.sharing import need_on, share_text, side_of
from rallypoint.core.types import PendingJob, Preemption
from rallypoint.core.units import running_milli

if TYPE_CHECKING:
    from rallypoint.core.context import Ctx
    from rallypoint.core.policies import Policy
    from rallypoint.core.preemption import RunningView

__all__ = ["evict", "preempt_for_gang", "preempt_for_part", "shares_stopping_for"]


def _evictable(job_id: str, rank: float, ctx: Ctx, view: RunningView) -> bool:
    rj = ctx.cluster.running[job_id]
    slot = view.cols.slot[job_id]
    return (
        rj.preemptible
        and ctx.class_preemptible.get(rj.priority_class, True)
        and rj.preempting_for is None
        and job_id not in ctx.preempted
        and not bool(view.protected[slot])
        and float(view.rank[slot]) < rank
    )


def _lost(job_id: str, view: RunningView) -> float:
    return float(view.lost[view.cols.slot[job_id]])


def preempt_for_part(
    job: PendingJob, types: list[str], policy: Policy, ctx: Ctx, out: list[Preemption]
) -> Status | None:
    """Room for a fractional or MIG ``job`` by evicting lower-ranked shares or slices on one GPU; None when
    no such room exists (or the cycle's preemption budget is spent)."""
    if policy.preemptor is None or ctx.counts["preemptors"] >= ctx.cfg.max_preemptors_per_cycle:
        return None
    rank = policy.orderer.rank(job, ctx)
    view = running_view(ctx, policy.orderer)
    best: tuple[tuple[int, float, int, int, int], str, list[str]] | None = None
    for t in types:
        found = (
            _share_victims(job, t, rank, ctx, view)
            if job.gpu_milli is not None
            else _slice_victims(job, t, rank, ctx, view)
        )
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], t, found[1])
    if best is None:
        return None
    ctx.ws.bump(ctx.counts, "preemptors")
    _, t, victims = best
    evict(job, victims, t, policy, ctx, out)
    return Status(
        "Preempting",
        f"needs {_part_text(job)}; preempting {len(victims)} job{'s' if len(victims) != 1 else ''} "
        f"({', '.join(victims)}); starts once they have stopped",
    )


def _part_text(job: PendingJob) -> str:
    if job.mig_profile is not None:
        return f"a {job.mig_profile} MIG slice"
    return share_text(job)


def _share_victims(
    job: PendingJob, t: str, rank: float, ctx: Ctx, view: RunningView
) -> tuple[tuple[int, float, int, int, int], list[str]] | None:
    side = side_of(ctx)
    idx, running = ctx.idx, ctx.cluster.running
    best: tuple[tuple[int, float, int, int, int], list[str]] | None = None
    for (node_id, g), ids in ctx.cluster.parts_on.items():
        o = idx.ord_of[node_id]
        if idx.type_of[o] != t or not ctx.ws.sched[o] or (node_id, g) not in ctx.cluster.shares:
            continue
        milli = need_on(job, idx.nodes[o])
        if milli is None:
            continue
        used = side.shares.get((o, g), 0)
        victims: list[str] = []
        freed = cpu = mem = 0
        for v in sorted(
            (i for i in ids if _evictable(i, rank, ctx, view)),
            key=lambda i: (float(view.rank[view.cols.slot[i]]), _lost(i, view), i),
        ):
            if used - freed + milli <= GPU_MILLI:
                break
            victims.append(v)
            rv = running[v]
            freed += rv.gpu_milli or 0
            cpu, mem = cpu + rv.cpu_milli, mem + rv.memory_mib
        fits_cpu = side.cpu_left[o] + cpu >= job.cpu_milli and side.mem_left[o] + mem >= job.memory_mib
        if not victims or used - freed + milli > GPU_MILLI or not fits_cpu:
            continue
        cost = (len(victims), sum(_lost(v, view) for v in victims), o, g, 0)
        if best is None or cost < best[0]:
            best = (cost, victims)
    return best


def _slice_victims(
    job: PendingJob, t: str, rank: float, ctx: Ctx, view: RunningView
) -> tuple[tuple[int, float, int, int, int], list[str]] | None:
    model = mig_model(t)
    if model is None or job.mig_profile not in {p.name for p in model.profiles}:
        return None
    wanted = model.profile(job.mig_profile)
    side = side_of(ctx)
    idx, running = ctx.idx, ctx.cluster.running
    best: tuple[tuple[int, float, int, int, int], list[str]] | None = None
    for o, g in side.mig_gpus:
        if idx.type_of[o] != t or not ctx.ws.sched[o]:
            continue
        on_gpu = ctx.cluster.parts_on.get((idx.ids[o], g), [])
        held = {(running[i].placements[0].mig.profile, running[i].placements[0].mig.start): i for i in on_gpu}  # type: ignore[union-attr]
        for start in wanted.starts:
            mask = wanted.mask_at(start)
            over = [
                inst
                for inst in side.mig_busy.get((o, g), ())
                if model.profile(inst.profile).mask_at(inst.start) & mask
            ]
            victims = [held.get((inst.profile, inst.start), "") for inst in over]
            # a slice bound this cycle (no running job yet) or one it may not evict blocks this placement
            if not victims or not all(v and _evictable(v, rank, ctx, view) for v in victims):
                continue
            cpu = sum(running[v].cpu_milli for v in victims)
            mem = sum(running[v].memory_mib for v in victims)
            if side.cpu_left[o] + cpu < job.cpu_milli or side.mem_left[o] + mem < job.memory_mib:
                continue
            cost = (len(victims), sum(_lost(v, view) for v in victims), o, g, start)
            if best is None or cost < best[0]:
                best = (cost, victims)
    return best


def evict(
    job: PendingJob, victims: list[str], t: str, policy: Policy, ctx: Ctx, out: list[Preemption]
) -> None:
    """Ask ``victims`` to stop for ``job`` (priority preemption), journaled like the planner's."""
    running = ctx.cluster.running
    for vid in victims:
        out.append(Preemption(victim_id=vid, reason=policy.reason_for("priority"), for_job=job.id))
        ctx.ws.put(ctx.preempted, vid, job.id)
        ctx.ws.bump(ctx.evicted, (running[vid].queue_name, t), running_milli(running[vid]))


def preempt_for_gang(
    job: PendingJob, size: int, t: str, policy: Policy, ctx: Ctx
) -> tuple[list[str], Plan] | None:
    """The shares a whole-GPU ``job`` must evict for a placement of ``size`` GPUs of type ``t``, and that
    placement; None when freeing every shared GPU it outranks still leaves no room."""
    rank = policy.orderer.rank(job, ctx)
    view = running_view(ctx, policy.orderer)
    ws, idx = ctx.ws, ctx.idx
    side = side_of(ctx)
    freeable: dict[tuple[int, int], list[str]] = {}
    mark = ws.mark()
    for (node_id, g), ids in ctx.cluster.parts_on.items():
        o = idx.ord_of[node_id]
        if (node_id, g) not in ctx.cluster.shares or idx.type_of[o] != t or not ws.sched[o]:
            continue
        # every share evictable, and none bound this cycle on it (side.shares counts those too)
        if side.shares.get((o, g)) != ctx.cluster.shares[(node_id, g)]:
            continue
        if all(_evictable(i, rank, ctx, view) for i in ids):
            freeable[(o, g)] = list(ids)
            ws.give(o, 1 << g)
    required = ctx.required_level(job)
    plan = (
        place(ws, size // job.gpus_per_task, job.gpus_per_task, t, required, ctx.cfg.first_fit)
        if freeable
        else None
    )
    ws.rollback(mark)
    if plan is None:
        return None
    victims = [v for o, m in plan.tasks for g in bits(m) for v in freeable.get((o, g), ())]
    return (victims, plan) if victims else None


def shares_stopping_for(preemptor: str, ctx: Ctx) -> list[tuple[int, int]]:
    """The shared GPUs (node ordinal, GPU) whose every share is stopping for ``preemptor``: its slot again
    while they stop."""
    running, idx = ctx.cluster.running, ctx.idx
    return [
        (idx.ord_of[node_id], g)
        for (node_id, g), ids in ctx.cluster.parts_on.items()
        if (node_id, g) in ctx.cluster.shares and all(running[i].preempting_for == preemptor for i in ids)
    ]
