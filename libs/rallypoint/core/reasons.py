"""Pending reasons: a code plus a message with numbers (Kueue / Slurm style)."""

from __future__ import annotations

from collections.abc import Sequence

from rallypoint.core.context import Ctx, Status, new_status
from rallypoint.core.formulas import job_types
from rallypoint.core.placement import best_free_at
from rallypoint.core.types import PendingJob

__all__ = ["classify", "human", "making_room", "once_stopped"]


def human(seconds: float) -> str:
    """Round durations the way people read a queue: "40 min", "3.5 h", "2 d"."""
    s = max(0.0, seconds)
    if s < 90:
        return f"{round(s)} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _jobs(ids: Sequence[str], what: str) -> str:
    return f"{len(ids)} {what}{'s' if len(ids) != 1 else ''} ({', '.join(ids)})"


def making_room(shrunk: Sequence[str], evicted: Sequence[str]) -> str:
    """What a preemptor's victims are asked to do, each job named once (a gang shrunk by several tasks
    is one job): "shrinking 1 elastic job (a) and preempting 2 jobs (b, c)"."""
    parts = []
    if shrunk:
        parts.append(f"shrinking {_jobs(shrunk, 'elastic job')}")
    if evicted:
        parts.append(f"preempting {_jobs(evicted, 'job')}")
    return " and ".join(parts)


def once_stopped(grace_s: float) -> str:
    """When a job that waits for stopping victims starts: as soon as their ranks have exited, which they
    may do at once (a coordinated checkpoint) or at the end of the grace, never later. The grace is a
    bound, not an estimate: no "~60 s" for a start that may come the next second."""
    return f"starts once they have stopped, within {human(grace_s)} (the preemption grace)"


_UNKNOWN = Status("", "")  # not yet in the static reasons memo (which also holds None: no static reason)


def classify(job: PendingJob, size: int, ctx: Ctx) -> Status:
    """Why ``job`` (at ``size`` GPUs) cannot be placed now, most fundamental cause first."""
    alts = job.gpu_types
    if alts is not None:
        return _classify_alts(job, alts, size, ctx)
    gpu_type = job.gpu_type
    g = job.gpus_per_task
    level = (ctx.required_level(job) if ctx.consolidate_small else job.topology_required) or "cluster"
    # the capacity checks do not depend on free GPUs: once per shape and cycle
    skey = (gpu_type, g, size, level)
    sr = ctx.static_reasons
    fixed = sr.get(skey, _UNKNOWN)
    if fixed is _UNKNOWN:
        if gpu_type is not None and gpu_type not in ctx.idx.type_capacity:
            fixed = Status("GangTooLarge", f"no node has GPU type {gpu_type}")
        else:
            fixed = _capacity_reason(gpu_type, job_types(job, ctx.idx), g, size, level, ctx)
        sr[skey] = fixed
    if fixed is not None:
        return fixed
    tf = ctx.ws.type_free
    # (the workspace's type_free has exactly the index's types as keys)
    free = sum(tf.values()) if gpu_type is None else tf.get(gpu_type, 0)
    tname = f" {gpu_type}" if gpu_type is not None else ""
    return _free_reason(free, tname, gpu_type, None, g, size, level, ctx)


def _classify_alts(job: PendingJob, alts: tuple[str, ...], size: int, ctx: Ctx) -> Status:
    """``classify`` for a job that allows several GPU types: capacities are the best of its types the
    cluster has, free GPUs the sum over them; messages name the types as the job lists them ("A|B")."""
    g = job.gpus_per_task
    level = (ctx.required_level(job) if ctx.consolidate_small else job.topology_required) or "cluster"
    name = "|".join(alts)
    types = ctx.job_types(job)
    skey = (alts, g, size, level)
    sr = ctx.static_reasons
    fixed = sr.get(skey, _UNKNOWN)
    if fixed is _UNKNOWN:
        if not types:
            fixed = Status("GangTooLarge", f"no node has GPU type {name}")
        else:
            fixed = _capacity_reason(name, types, g, size, level, ctx)
        sr[skey] = fixed
    if fixed is not None:
        return fixed
    tf = ctx.ws.type_free
    free = sum(tf.get(t, 0) for t in types)
    return _free_reason(free, f" {name}", None, types, g, size, level, ctx)


def _free_reason(
    free: int,
    tname: str,
    gpu_type: str | None,
    types: list[str] | None,
    g: int,
    size: int,
    level: str,
    ctx: Ctx,
) -> Status:
    """The part of ``classify`` that depends on free GPUs and holds (``types``: a multi-type job's)."""
    if free >= size:
        if level == "cluster":
            return new_status(
                "Topology",
                f"needs {size // g} tasks x {g}{tname} GPUs (one node each); {free} GPUs free but fragmented",
            )
        best = best_free_at(ctx.ws, gpu_type, level, types)
        return new_status(
            "Topology", f"needs {size}{tname} GPUs in one {level}; best {level} has {best} free"
        )
    where = "in the cluster" if level == "cluster" else f"in one {level}"
    if ctx.holds:
        held = sum(m.bit_count() for h in ctx.holds for _o, m in h.tasks)
        if free + held >= size:
            first = min(ctx.holds, key=lambda h: (h.until, h.job_id))
            wait = human(first.until - ctx.now)
            # a strict hold is a preemptor's: its end is the victims' grace, a bound, not an estimate
            when = (
                f"starts within {wait}, once its victims stop"
                if first.strict
                else f"reserved, starts in ~{wait}"
            )
            return Status(
                "Reservation",
                f"needs {size}{tname} GPUs; {free} free outside reservations; would delay job "
                f"{first.job_id} ({when})",
            )
    return new_status("Resources", f"needs {size}{tname} GPUs {where}; {free} free")


def _capacity_reason(
    name: str | None, types: list[str], g: int, size: int, level: str, ctx: Ctx
) -> Status | None:
    """GangTooLarge / NodeUnhealthy, or None when the shape fits the healthy cluster. ``types`` (all known
    to the cluster) are the candidates, ``name`` how messages call them (the job's type, "A|B", or None
    for any type)."""
    where = "in the cluster" if level == "cluster" else f"in one {level}"
    tname = f" {name}" if name is not None else ""
    node_max = max((ctx.total_capacity(t, "node") for t in types), default=0)
    if g > node_max:
        return Status("GangTooLarge", f"a task needs {g} GPUs; largest node has {node_max}")
    cap = max((ctx.total_capacity(t, level) for t in types), default=0)
    if size > cap:
        return Status("GangTooLarge", f"needs {size}{tname} GPUs {where}; largest {level} has {cap}")
    healthy = max((ctx.healthy_capacity(t, level) for t in types), default=0)
    if size > healthy:
        idx = ctx.idx
        if not idx.tainted:
            others = "unhealthy ones"
        else:  # a tainted node is closed to this job as an unhealthy one is (``core.constraints``)
            taints = ", ".join(sorted({t for o in idx.tainted for t in idx.nodes[o].taints}))
            others = f"unhealthy ones or ones tainted {taints} that it does not tolerate"
        return Status(
            "NodeUnhealthy",
            f"needs {size}{tname} GPUs {where}; {healthy} on healthy nodes, {cap - healthy} on {others}",
        )
    return None
