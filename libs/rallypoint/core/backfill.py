"""Reservations for EASY backfill: the earliest slot of a blocked job from running jobs' expected ends.

The probe replays releases in expected-end order on the workspace (journaled), checks placement at
geometrically growing steps, then binary-searches the exact release that first makes the gang fit, and
rolls everything back. Cost: O(releases needed) GPU-mask updates plus O(log) placement checks.
The GPUs of the found slot that are free now are then *held* (taken out of the workspace), so a later
job can use them only if it ends before the shadow time (see ``engine``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Protocol

from rallypoint.core.context import Ctx, Hold
from rallypoint.core.placement import Plan, place
from rallypoint.core.types import PendingJob

__all__ = ["EasyReserver", "Reserver", "earliest_slot"]


class Reserver(Protocol):
    def reserve(self, job: PendingJob, size: int, gpu_type: str | None, ctx: Ctx) -> Hold | None:
        """Find and hold the earliest slot; None when no slot is known (unknown runtimes). A job with
        ``gpu_types`` (then ``gpu_type`` is None) may only use those (``Ctx.job_types``). A reservation
        made counts in ``ctx.counts["reservations"]`` (``ctx.ws.bump``): the engine calls no reserver
        once that reaches ``max_reservations``."""
        ...


def _releases(ctx: Ctx) -> Iterator[tuple[float, tuple[tuple[int, int], ...]]]:
    """(end, [(node ordinal, mask)]) of running jobs and of this cycle's binds, earliest first.
    Jobs chosen as preemption victims this cycle are skipped: their GPUs are promised to the preemptor."""
    cl = ctx.cluster
    ord_of = ctx.idx.ord_of
    now = ctx.now

    def running() -> Iterator[tuple[float, str, tuple[tuple[int, int], ...]]]:
        for end, jid in cl.ends:
            if jid in ctx.preempted:
                continue
            yield (max(end, now), jid, tuple((ord_of[n], m) for n, m in cl.job_masks[jid]))

    for end, _jid, tasks in heapq.merge(running(), sorted(ctx.cycle_ends)):
        yield end, tasks


def earliest_slot(
    ctx: Ctx,
    tasks: int,
    gpt: int,
    gpu_type: str | None,
    required: str | None,
    alts: list[str] | None = None,
) -> tuple[float, Plan] | None:
    """The earliest (release time, plan) for the gang, or None. ``alts``: the allowed GPU types of a job
    that lists several, in its order of preference: the slot is the earliest time at which it fits on
    any of them, placed on the first one (in that order) where the gang fits at that time."""
    if alts is not None and not alts:
        return None
    ws = ctx.ws
    base = ws.mark()
    it = _releases(ctx)
    ends: list[float] = []
    rel: list[tuple[tuple[int, int], ...]] = []
    marks: list[int] = []
    applied = 0
    first_fit = ctx.cfg.first_fit
    types = (ctx.idx.types if gpu_type is None else [gpu_type]) if alts is None else alts
    need = tasks * gpt

    def go_to(k: int) -> None:
        nonlocal applied
        if k < applied:
            ws.rollback(marks[k])
            del marks[k:]
            applied = k
        while applied < k:
            marks.append(ws.mark())
            for o, m in rel[applied]:
                ws.give(o, m)
            applied += 1

    def fits() -> Plan | None:
        if sum(ws.type_free.get(t, 0) for t in types) < need:
            return None
        if alts is not None:
            for t in alts:
                if ws.type_free.get(t, 0) >= need:
                    p = place(ws, tasks, gpt, t, required, first_fit)
                    if p is not None:
                        return p
            return None
        return place(ws, tasks, gpt, gpu_type, required, first_fit)

    lo, hi, step = 0, -1, 1
    exhausted = False
    while hi < 0:
        target = applied + step
        while len(rel) < target:
            nxt = next(it, None)
            if nxt is None:
                exhausted = True
                break
            ends.append(nxt[0])
            rel.append(nxt[1])
        go_to(len(rel))
        if fits() is not None:
            hi = applied
        elif exhausted:
            ws.rollback(base)
            return None
        else:
            lo = applied
            step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        go_to(mid)
        if fits() is not None:
            hi = mid
        else:
            lo = mid
    if alts is not None and hi > 0:
        # several allowed types: every release at the slot's time counts, so that a tie between types
        # goes to the job's preferred one (not to whichever job's release came first)
        t_end = ends[hi - 1]
        while True:
            if hi == len(rel):
                nxt = next(it, None)
                if nxt is None:
                    break
                ends.append(nxt[0])
                rel.append(nxt[1])
            if ends[hi] != t_end:
                break
            hi += 1
    go_to(hi)
    plan = fits()
    ws.rollback(base)
    if plan is None or hi == 0:
        return None
    return ends[hi - 1], plan


def hold(ctx: Ctx, job_id: str, until: float, plan: Plan, strict: bool = False) -> Hold:
    """Take the currently free GPUs of ``plan`` out of the workspace for ``job_id`` (``strict``: for a
    preemptor; no other job may use them this cycle)."""
    ws = ctx.ws
    held: list[tuple[int, int]] = []
    for o, m in plan.tasks:
        part = m & ws.free[o]
        if part:
            ws.take(o, part)
            held.append((o, part))
    h = Hold(job_id, until, tuple(held), strict)
    ws.add_hold(h)
    return h


class EasyReserver:
    """EASY: reserve for up to ``max_reservations`` blocked jobs per cycle (the head job first)."""

    def reserve(self, job: PendingJob, size: int, gpu_type: str | None, ctx: Ctx) -> Hold | None:
        if ctx.counts["reservations"] >= ctx.cfg.max_reservations:
            return None
        ctx.ws.bump(ctx.counts, "reservations")
        alts = ctx.job_types(job) if job.gpu_types is not None else None
        slot = earliest_slot(
            ctx, size // job.gpus_per_task, job.gpus_per_task, gpu_type, ctx.required_level(job), alts
        )
        if slot is None:
            return None
        return hold(ctx, job.id, slot[0], slot[1])
