"""Consolidation: move a few small running jobs so that a gang blocked only by fragmentation can start.

KAI's order of actions is allocate > consolidate > reclaim > preempt. A job whose GPUs are free in total
but scattered (pending reason ``Topology``) would otherwise wait for whole nodes to drain, with the free
GPUs idle, or preempt someone. Consolidation instead picks, on as few nodes as the gang has tasks, the
cheapest single-task running jobs ("movers") whose GPUs complete those nodes, and checks on the workspace
that

1. the gang fits once the movers' GPUs are free, and
2. every mover fits again elsewhere in what is left free after the gang takes its GPUs.

The movers are asked to checkpoint and stop (``Preemption`` with reason ``consolidate``); they go back to
the queue and restart from their checkpoint on the free GPUs the plan saw, while the gang's slot is held
for it exactly as for a preemptor. A mover loses only the work since its last checkpoint; nobody is
evicted for good, so a mover may be of the gang's own class (never of a higher class: moving costs it a
restart). Movers are never jobs that started or were preempted recently (``start_protection_s`` /
``preemption_protection_s``), so a job is not moved back and forth.

Bounded cost: only gangs of at most ``consolidate_max_tasks`` tasks, at most
``max_consolidations_per_cycle`` attempts per cycle; per attempt one numpy pass over the task rows, then
Python work for a handful of candidate nodes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rallypoint.core.context import Ctx
from rallypoint.core.ordering import class_rank_array
from rallypoint.core.placement import Plan, place
from rallypoint.core.preemption import RunningView, drop_chosen, job_tasks
from rallypoint.core.types import PendingJob

__all__ = ["ConsolidationPlan", "plan_consolidation"]

_CANDIDATE_NODES = 8  # nodes costed per task of the gang (cheapest by GPUs still missing)


class ConsolidationPlan(NamedTuple):
    movers: tuple[str, ...]  # running jobs to checkpoint, stop and re-place
    plan: Plan  # the gang's placement once the movers' GPUs are free


def _movable(job: PendingJob, gpt: int, gpu_type: str, ctx: Ctx, view: RunningView) -> np.ndarray:
    """Per running-job slot: may it be moved for ``job``? Single-task, preemptible, of the gang's GPU type
    and of a class not above the gang's, smaller than one task of the gang, not recently started or
    preempted, not already stopping or chosen this cycle."""
    cols = view.cols
    n = view.n
    tid = cols.gtypes.ids.get(gpu_type)
    if tid is None or n == 0:
        return np.zeros(n, np.bool_)
    one_task = np.bincount(view.t_job, minlength=n)[:n] == 1
    ok = (
        view.base
        & ~view.protected
        & ~view.protected_las
        & one_task
        & (cols.gtype[:n] == tid)
        & (cols.gpus[:n] < gpt)
        & (class_rank_array(cols, ctx) <= ctx.prio_of(job))
    )
    drop_chosen(ok, ctx, view)
    return ok


def plan_consolidation(
    job: PendingJob, size: int, gpu_type: str, ctx: Ctx, view: RunningView
) -> ConsolidationPlan | None:
    """Movers that make room for ``job`` at ``size`` GPUs of ``gpu_type``, or None."""
    gpt = job.gpus_per_task
    tasks = size // gpt
    ws = ctx.ws
    idx = ctx.idx
    if tasks > ctx.cfg.consolidate_max_tasks or ws.type_free.get(gpu_type, 0) < size:
        return None
    movable = _movable(job, gpt, gpu_type, ctx, view)
    if not movable.any():
        return None
    t_mov = movable[view.t_job]
    n_nodes = len(idx.ids)
    mov_gpus = np.bincount(view.t_ord[t_mov], weights=view.t_gpus[t_mov], minlength=n_nodes)
    free = np.frombuffer(ws.fcount, np.uint16)[:n_nodes].astype(np.int64)
    of_type = idx.type_np == idx.types.index(gpu_type)
    sched = np.frombuffer(bytes(ws.sched), np.uint8)[:n_nodes].astype(np.bool_)
    short = gpt - free
    cand = np.flatnonzero(of_type & sched & (short > 0) & (free + mov_gpus >= gpt))
    if len(cand) < tasks:
        return None
    # the nodes missing the fewest GPUs first (ties by ordinal: deterministic)
    cand = cand[np.lexsort((cand, short[cand]))][: tasks * _CANDIDATE_NODES]
    cols = view.cols
    mov_slots = np.flatnonzero(t_mov)
    by_node: dict[int, list[int]] = {}
    cand_set = set(cand.tolist())
    for r in mov_slots.tolist():
        o = int(view.t_ord[r])
        if o in cand_set:
            by_node.setdefault(o, []).append(int(view.t_job[r]))
    lost = view.lost
    costed: list[tuple[int, float, int, list[int]]] = []
    for o in cand.tolist():
        need = int(short[o])
        # cheapest movers first: least work lost, then more GPUs (fewer movers), then job id
        slots = sorted(by_node.get(o, ()), key=lambda s: (float(lost[s]), -int(cols.gpus[s]), cols.ids[s]))
        chosen: list[int] = []
        got = 0
        for s in slots:
            if got >= need:
                break
            chosen.append(s)
            got += int(cols.gpus[s])
        if got >= need:
            costed.append((len(chosen), float(sum(float(lost[s]) for s in chosen)), o, chosen))
    if len(costed) < tasks:
        return None
    costed.sort(key=lambda c: (c[0], c[1], c[2]))
    movers = [s for c in costed[:tasks] for s in c[3]]
    mark = ws.mark()
    try:
        for s in movers:
            for o, m in job_tasks(ctx, cols.ids[s]):
                ws.give(o, m)
        plan = place(ws, tasks, gpt, gpu_type, ctx.required_level(job), ctx.cfg.first_fit)
        if plan is None:
            return None
        used: dict[int, int] = {}
        for o, m in plan.tasks:
            used[o] = used.get(o, 0) | m
        # a mover whose GPUs the plan does not touch stays where it is
        kept = []
        for s in movers:
            jt = job_tasks(ctx, cols.ids[s])
            if any(used.get(o, 0) & m for o, m in jt):
                kept.append(s)
            else:
                for o, m in jt:
                    ws.take(o, m)
        if not kept:
            return None  # (cannot happen: the gang did not fit before) nothing to move
        for o, m in plan.tasks:
            ws.take(o, m)
        # every mover must fit again on what is left (largest first), never back onto the gang's GPUs
        for s in sorted(kept, key=lambda s: (-int(cols.gpus[s]), cols.ids[s])):
            g = int(cols.gpus[s])
            home = place(ws, 1, g, gpu_type, "node", ctx.cfg.first_fit)
            if home is None:
                return None
            for o, m in home.tasks:
                ws.take(o, m)
        return ConsolidationPlan(tuple(sorted(cols.ids[s] for s in kept)), plan)
    finally:
        ws.rollback(mark)
