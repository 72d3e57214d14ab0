"""Jobs that ask for more than whole GPUs: a fraction of one GPU, or CPU and memory on each task's node.

The engine sends a job here when it asks for any of these (``engine._attempt``):

- **A fractional job** (``PendingJob.gpu_milli``, 1-999 thousandths): one task on one GPU that other
  fractional jobs may share. It goes to the shared GPU of its type with the least room left that still
  holds it (best fit: the emptiest shared GPUs stay open for bigger shares), else to a free GPU of the node
  with the fewest free GPUs (best fit again: whole free nodes stay whole for gangs), inside its tightest
  NVLink domain. A shared GPU is never free for whole-GPU jobs while any share of it is bound.
- **CPU and memory per task** (``cpu_milli`` / ``memory_mib``): every task's node must have that much left.
  For a whole-GPU gang the normal placement runs on a workspace where each node offers only as many of
  its free GPUs as it has CPU and memory for (a transaction rolled back at once), so every topology rule
  of ``placement`` holds unchanged.

Such a job binds on free room only and reserves nothing; a fractional or MIG job may evict lower-ranked
shares or slices (``core.part_preemption``), and is never a victim of the whole-GPU planner
(``ClusterModel._register_part``). ``docs/sharing.md`` says what this leaves out and why. Jobs that ask for
none of it never come here, so whole-GPU scheduling costs the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.core import constraints
from rallypoint.core.cluster import GPU_MILLI
from rallypoint.core.mig import MEMORY_SLICES, MigInstance, carve, free_mask, mig_model, room
from rallypoint.core.placement import Plan, _pick, new_plan, place
from rallypoint.events.catalogue import MigSlice

if TYPE_CHECKING:
    from rallypoint.core.context import Ctx
    from rallypoint.core.types import Node, PendingJob
    from rallypoint.core.workspace import Workspace

__all__ = ["SideResources", "least_share", "never_fits", "record", "side_of", "try_place", "why_short"]

_UNLIMITED = 1 << 62
ALL_SLICES = (1 << MEMORY_SLICES) - 1  # every memory slice of a MIG GPU, as bits


def selected(job: PendingJob, ctx: Ctx) -> list[bool] | None:
    """Per node ordinal, whether the node has every label of the job's ``node_selector`` (None: no
    selector, every node does); memoized per selector for the cycle."""
    if not job.node_selector:
        return None
    memo = ctx.cache.setdefault("selected", {})
    assert isinstance(memo, dict)
    hit = memo.get(job.node_selector)
    if hit is None:
        wanted = set(job.node_selector)
        hit = memo[job.node_selector] = [wanted <= set(n.labels) for n in ctx.idx.nodes]
    return hit


class SideResources:
    """The cycle's view of what whole-GPU bookkeeping does not hold: CPU and memory left per node
    ordinal and the thousandths used on each shared GPU. Built on the first job that asks (a cycle without
    one never pays for it) and kept by ``record`` as such jobs bind."""

    def __init__(self, ws: Workspace) -> None:
        idx, cluster = ws.idx, ws.cluster
        self.nodes = idx.nodes
        used = cluster.node_cpu_mem_used
        self.cpu_left = [n.cpu_milli for n in idx.nodes]
        self.mem_left = [n.memory_mib for n in idx.nodes]
        for node_id, (cpu, mem) in used.items():
            o = idx.ord_of[node_id]
            self.cpu_left[o] -= cpu
            self.mem_left[o] -= mem
        # (node ordinal, GPU) -> thousandths in use
        self.shares: dict[tuple[int, int], int] = {
            (idx.ord_of[node_id], g): milli for (node_id, g), milli in cluster.shares.items()
        }
        # every GPU in MIG mode, (node ordinal, GPU) in that order, and the busy slices of each
        self.mig_gpus = [(o, g) for o, n in enumerate(idx.nodes) for g in n.mig_gpus]
        self.mig_busy: dict[tuple[int, int], tuple[MigInstance, ...]] = {
            (idx.ord_of[node_id], g): busy for (node_id, g), busy in cluster.mig_busy.items()
        }
        # the slice each MIG job bound this cycle got (the engine writes it into the job's Bind)
        self.slices: dict[str, MigSlice] = {}
        # the share each job asking for GPU memory got on its GPU (the engine writes it into the Bind)
        self.milli: dict[str, int] = {}

    def usable(self, ws: Workspace, o: int, t: str, job: PendingJob, allowed: list[bool] | None) -> bool:
        """Node ``o`` is of type ``t``, schedulable, allowed by the job's selector and has one task's
        CPU and memory left."""
        return (
            ws.idx.type_of[o] == t
            and ws.sched[o]
            and (allowed is None or allowed[o])
            and self.tasks_fit(o, job.cpu_milli, job.memory_mib) > 0
        )

    def tasks_fit(self, o: int, cpu: int, mem: int) -> int:
        """How many tasks of (``cpu``, ``mem``) node ``o`` has room for."""
        by_cpu = self.cpu_left[o] // cpu if cpu else _UNLIMITED
        by_mem = self.mem_left[o] // mem if mem else _UNLIMITED
        return max(0, min(by_cpu, by_mem))


def need_on(job: PendingJob, node: Node) -> int | None:
    """The thousandths of one of ``node``'s GPUs the fractional ``job`` needs: its ``gpu_milli``, or
    more when its GPU memory is a larger part of the GPU's (rounded up); None when the GPU cannot hold it
    (more memory than the GPU has, or a GPU of unknown memory)."""
    milli = job.gpu_milli or 0
    mem = job.gpu_memory_mib
    if mem is None:
        return milli
    if node.gpu_memory_mib <= 0 or mem > node.gpu_memory_mib:
        return None
    return max(milli, -(-mem * GPU_MILLI // node.gpu_memory_mib))


def least_share(job: PendingJob, gpu_type: str, ctx: Ctx) -> int:
    """The smallest share ``job`` (fractional, asking for GPU memory) takes on any GPU of ``gpu_type``
    (``need_on`` on its node of the most GPU memory): what its quota is checked for before it is placed,
    and again for the share it gets once it is. Memoized per cycle."""
    key = f"least_share {gpu_type} {job.gpu_milli} {job.gpu_memory_mib}"
    found = ctx.cache.get(key)
    if found is None:
        needs = [need_on(job, n) for n in ctx.idx.nodes if n.gpu_type == gpu_type]
        found = ctx.cache[key] = min((x for x in needs if x is not None), default=job.gpu_milli or 0)
    assert isinstance(found, int)
    return found


def share_text(job: PendingJob) -> str:
    """What a fractional job asks for, in words: ``0.25 of a GPU``, ``20480 MiB of a GPU's memory``."""
    parts = [f"{job.gpu_milli / GPU_MILLI:g} of a GPU"] if job.gpu_milli else []
    if job.gpu_memory_mib is not None:
        parts.append(f"{job.gpu_memory_mib} MiB of a GPU's memory")
    return " and ".join(parts)


def side_of(ctx: Ctx) -> SideResources:
    side = ctx.cache.get("sharing")
    if side is None:
        side = ctx.cache["sharing"] = SideResources(ctx.ws)
    assert isinstance(side, SideResources)
    return side


def try_place(job: PendingJob, size: int, gpu_type: str, ctx: Ctx) -> Plan | None:
    """A plan for ``job`` on free room of ``gpu_type`` now, or None (the workspace is left as it was:
    tainted nodes the job tolerates are open only while it is placed, ``constraints.open_tolerated``)."""
    side = side_of(ctx)
    allowed = constraints.allowed_nodes(job, ctx)
    mark = ctx.ws.mark()
    constraints.open_tolerated(job, allowed, ctx)
    if job.gpu_milli is not None:
        plan = _place_share(ctx.ws, side, job, gpu_type, allowed)
    elif job.mig_profile is not None:
        plan = _place_mig(ctx.ws, side, job, gpu_type, allowed)
    else:
        plan = _place_gang(ctx, side, job, size, gpu_type, allowed)
    ctx.ws.rollback(mark)
    return plan


def _place_mig(
    ws: Workspace, side: SideResources, job: PendingJob, t: str, allowed: list[bool] | None
) -> Plan | None:
    """The MIG GPU of type ``t`` where ``carve`` fits the slice and leaves the least room (pack MIG GPUs:
    the emptiest stay open for large profiles), ties by node order then GPU; on that GPU, carve's start."""
    profile = job.mig_profile
    model = mig_model(t)
    if profile is None or model is None or profile not in {p.name for p in model.profiles}:
        return None
    wanted = model.profile(profile)
    best: tuple[int, int, int, int] | None = None
    for o, g in side.mig_gpus:
        if not side.usable(ws, o, t, job, allowed):
            continue
        busy = side.mig_busy.get((o, g), ())
        c = carve(model, busy, profile)
        if c is None:
            continue
        taken = ~free_mask(model, busy) | wanted.mask_at(c.start)
        key = (room(model, taken & ALL_SLICES), o, g, c.start)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    _room, o, g, start = best
    side.slices[job.id] = MigSlice(profile=profile, start=start)
    return new_plan(t, "nvlink", ((o, 1 << g),))


def _place_share(
    ws: Workspace, side: SideResources, job: PendingJob, t: str, allowed: list[bool] | None
) -> Plan | None:
    nodes = ws.idx.nodes
    best: tuple[int, int, int] | None = None
    for (o, g), used in side.shares.items():
        milli = need_on(job, nodes[o])
        if milli is None or GPU_MILLI - used - milli < 0 or not side.usable(ws, o, t, job, allowed):
            continue
        key = (GPU_MILLI - used - milli, o, g)
        if best is None or key < best:
            best = key
    if best is not None:
        return _share_plan(side, job, t, best[1], 1 << best[2])
    buckets = ws.buckets.get(t)
    if buckets is None:
        return None
    for c in range(1, len(buckets)):
        for o in buckets[c]:
            if side.usable(ws, o, t, job, allowed) and need_on(job, nodes[o]) is not None:
                return _share_plan(side, job, t, o, _pick(ws, o, ws.free[o], 1))
    return None


def _share_plan(side: SideResources, job: PendingJob, t: str, o: int, mask: int) -> Plan:
    if job.gpu_memory_mib is not None:  # its share there, for the Bind (``need_on``)
        need = need_on(job, side.nodes[o])
        assert need is not None
        side.milli[job.id] = need
    return new_plan(t, "nvlink", ((o, mask),))


def _place_gang(
    ctx: Ctx, side: SideResources, job: PendingJob, size: int, t: str, allowed: list[bool] | None
) -> Plan | None:
    """Whole GPUs: ``placement.place`` on the nodes' free GPUs cut down to what their CPU and memory
    can feed, inside a transaction rolled back before returning."""
    ws = ctx.ws
    gpt = job.gpus_per_task
    buckets = ws.buckets.get(t)
    if buckets is None:
        return None
    mark = ws.mark()
    for c in range(1, len(buckets)):
        for o in list(buckets[c]):  # (``take`` moves nodes between buckets)
            fits = side.tasks_fit(o, job.cpu_milli, job.memory_mib) if allowed is None or allowed[o] else 0
            if fits * gpt < c:
                free = ws.free[o]
                keep = 0
                for _ in range(min(fits, c // gpt)):
                    keep |= _pick(ws, o, free & ~keep, gpt)
                ws.take(o, free & ~keep)
    plan = place(ws, size // gpt, gpt, t, ctx.required_level(job), ctx.cfg.first_fit)
    ws.rollback(mark)
    return plan


def record(job: PendingJob, plan: Plan, ctx: Ctx) -> None:
    """The bound ``plan``'s CPU, memory and GPU share leave the cycle's side resources."""
    side = side_of(ctx)
    for o, mask in plan.tasks:
        side.cpu_left[o] -= job.cpu_milli
        side.mem_left[o] -= job.memory_mib
        key = (o, mask.bit_length() - 1)
        if job.gpu_milli is not None:
            side.shares[key] = side.shares.get(key, 0) + side.milli.get(job.id, job.gpu_milli)
        if job.mig_profile is not None:
            cut = side.slices[job.id]
            side.mig_busy[key] = (*side.mig_busy.get(key, ()), MigInstance(cut.profile, cut.start, True))


def never_fits(job: PendingJob, types: list[str], ctx: Ctx) -> str | None:
    """Why a whole-GPU gang with a node selector can never run here (the nodes it allows, healthy or not,
    hold fewer GPUs of its types than it asks for); None when it might. A ``GangTooLarge``: rejected."""
    allowed = selected(job, ctx)
    if allowed is None or job.gpu_milli is not None or job.mig_profile is not None:
        return None
    idx = ctx.idx
    has = sum(idx.full[o].bit_count() for o, ok in enumerate(allowed) if ok and idx.type_of[o] in types)
    if has >= job.gpus:
        return None
    wanted = ", ".join(f"{k}={v}" for k, v in job.node_selector)
    return f"asks for {job.gpus} GPUs; the nodes its node selector ({wanted}) allows have {has}"


def why_short(job: PendingJob, types: list[str], ctx: Ctx) -> str:
    """What the job lacks, naming the resource: the GPU room, else CPU or memory on the nodes with it."""
    side = side_of(ctx)
    ws = ctx.ws
    allowed = constraints.allowed_nodes(job, ctx)
    excluded = constraints.why_excluded(job, allowed, types, ctx)
    if excluded is not None:
        return excluded
    if job.mig_profile is not None:
        return _why_no_slice(job, types, side, ctx)
    milli = job.gpu_milli
    with_share = {
        o
        for (o, _g), used in side.shares.items()
        if milli is not None and used + (need_on(job, side.nodes[o]) or GPU_MILLI + 1) <= GPU_MILLI
    }
    need = 1 if milli is not None else job.gpus_per_task
    gpu_room = [  # ordinals with GPU room of an allowed type, on a node its rules allow (a tainted one
        # it tolerates included: closed to everyone else, ``constraints``)
        o
        for o, t in enumerate(ws.idx.type_of)
        if t in types
        and (ws.sched[o] or (allowed is not None and allowed[o] and ws.idx.nodes[o].schedulable))
        and (allowed is None or allowed[o])
        and (ws.free[o].bit_count() >= need or o in with_share)
    ]
    what = share_text(job) if milli is not None else f"{job.gpus} GPUs"
    if not gpu_room:
        return f"needs {what}; no node of its type has that room free"
    cpu_short = job.cpu_milli and all(side.cpu_left[o] < job.cpu_milli for o in gpu_room)
    if cpu_short:
        most = max(side.cpu_left[o] for o in gpu_room)
        return (
            f"needs {job.cpu_milli} millicores of CPU per task; the nodes with GPU room have at most "
            f"{most} left"
        )
    mem_short = job.memory_mib and all(side.mem_left[o] < job.memory_mib for o in gpu_room)
    if mem_short:
        most = max(side.mem_left[o] for o in gpu_room)
        return (
            f"needs {job.memory_mib} MiB of memory per task; the nodes with GPU room have at most {most} left"
        )
    return (
        f"needs {what} with {job.cpu_milli} millicores and {job.memory_mib} MiB per task; no set of "
        "nodes has all of it at once"
    )


def _why_no_slice(job: PendingJob, types: list[str], side: SideResources, ctx: Ctx) -> str:
    offering = [
        t
        for t in types
        if (m := mig_model(t)) is not None and job.mig_profile in {p.name for p in m.profiles}
    ]
    if not offering:
        return f"needs a {job.mig_profile} MIG slice; no GPU model of its types offers that profile"
    if not any(ctx.idx.type_of[o] in offering for o, _g in side.mig_gpus):
        return f"needs a {job.mig_profile} MIG slice; no GPU of its types is in MIG mode"
    return f"needs a {job.mig_profile} MIG slice; no MIG GPU has a free layout for it now"
