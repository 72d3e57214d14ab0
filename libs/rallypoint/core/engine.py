"""The scheduling cycle: order -> filter -> permit (quota) -> place -> backfill / preempt / reserve -> reason.

``run_cycle`` is the body of :func:`rallypoint.core.schedule`. It reads the snapshot, works on a
:class:`Workspace` (never on the caller's ClusterModel) and returns :class:`Decisions`. Cost is
proportional to what can be scheduled: once no GPU of any type is free, the remaining jobs get their
reason without a placement search (the placement itself bails out on free counts in O(1), and failures
of a gang shape are memoized until something is released).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import numpy as np

from rallypoint.core import constraints, part_preemption, reasons, rule_preemption, sharing
from rallypoint.core.backfill import hold
from rallypoint.core.consolidation import plan_consolidation
from rallypoint.core.context import Ctx, Status
from rallypoint.core.formulas import add_team_usage, job_types, runtime_estimate
from rallypoint.core.placement import BITS, Plan, bits, place
from rallypoint.core.preemption import running_view
from rallypoint.core.quota import amount_text
from rallypoint.core.types import (
    CPU,
    MEMORY,
    SERVICE,
    Bind,
    Decisions,
    PendingJob,
    PendingReason,
    Preemption,
    Reservation,
    Resize,
    TaskPlacement,
)
from rallypoint.core.units import GPU_MILLI, job_milli, running_milli

if TYPE_CHECKING:
    from rallypoint.core.policies import Policy
    from rallypoint.core.types import Snapshot

__all__ = ["run_cycle"]

# reason codes that a preemption or a reservation may help
_WAITS_FOR_ROOM = frozenset(("Resources", "Topology", "Reservation"))


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


def _bind(job: PendingJob, size: int, plan: Plan, ctx: Ctx, out: _Out, milli: int | None = None) -> None:
    """``milli``: the GPU quota it takes (``units.job_milli``); None: ``size`` whole GPUs."""
    tasks = plan.tasks
    q = job.queue  # job.queue_name inlined (every bind)
    team = job.team
    if milli is None:
        milli = size * GPU_MILLI
    ctx.ws.bind(tasks, q if q is not None else team, plan.gpu_type, milli)
    if job.service:  # its queue's service capacity (``ServiceCapacity``) for the rest of the cycle
        ctx.ws.add_usage(q if q is not None else team, SERVICE, size)
    ids = ctx.idx.ids
    get_bits = BITS.get  # (``bits``' memo read inline: one lookup per task of every bind)
    # build the output structs directly (no intermediate tuples per task)
    if len(tasks) == 1:  # most binds
        o, m = tasks[0]
        b = get_bits(m)
        if b is None:
            b = bits(m)
        placements: tuple[TaskPlacement, ...] = (TaskPlacement(task=0, node_id=ids[o], gpus=b),)
    else:
        pl = []
        for i, (o, m) in enumerate(tasks):
            b = get_bits(m)
            if b is None:
                b = bits(m)
            pl.append(TaskPlacement(task=i, node_id=ids[o], gpus=b))
        placements = tuple(pl)
    cpu, mem = job.cpu_milli, job.memory_mib
    if cpu or mem:
        cpu, mem = cpu * len(tasks), mem * len(tasks)
    add_team_usage(ctx.team_usage, team, milli, cpu, mem)  # (Ctx.add_team_usage)
    ctx._shares.pop(team, None)
    out.binds.append(Bind(job_id=job.id, gpus=size, placements=placements))
    rt = runtime_estimate(job)
    # (a fractional job's end frees no whole GPU while others share it: reservations never count on it)
    if rt is not None and job.gpu_milli is None:
        ctx.cycle_ends.append((ctx.now + rt, job.id, plan.tasks))


def _try_place(job: PendingJob, size: int, gpu_type: str | None, ctx: Ctx) -> Plan | None:
    """Place around held GPUs; a job that ends before every (non-strict) hold's shadow time may also use
    them, and a preemptor may use its own hold."""
    tasks = size // job.gpus_per_task
    required = ctx.required_level(job) if ctx.consolidate_small else job.topology_required
    ws = ctx.ws
    own = ctx.hold_of(job.id) if ctx.holds and job.id in ctx.hold_ids else None  # (hold_of's fast miss)
    if own is not None:
        # a preemptor whose victims are stopping: its hold is its own; on success the hold is consumed
        # (its GPUs stay given back, and the bind takes them)
        mark = ws.mark()
        for o, m in own.tasks:
            ws.give(o, m)
        plan = ctx.place(tasks, job.gpus_per_task, gpu_type, required)
        if plan is not None:
            ws.remove_hold(own)
            return plan
        ws.rollback(mark)
        return None
    plan = ctx.place(tasks, job.gpus_per_task, gpu_type, required)
    if plan is not None or not ctx.holds:
        return plan
    rt = runtime_estimate(job)
    if rt is None or ctx.now + rt > ctx.held_until():
        return None
    # memo of failed probes: while no GPU was released and the holds did not change, the probed state
    # (free + held GPUs) can only have shrunk (binds), and a gang that failed fails again (the same
    # monotonicity as ``Ctx.place``'s memo)
    pkey = (gpu_type, job.gpus_per_task, required)
    pm = ctx._probe_memo.get(pkey)
    if pm is not None and pm[0] == ws.release_epoch and pm[1] == ws.hold_changes and tasks >= pm[2]:
        return None
    mark = ws.mark()
    for h in ctx.holds:
        if not h.strict:
            for o, m in h.tasks:
                ws.give(o, m)
    plan = ctx.place(tasks, job.gpus_per_task, gpu_type, required)
    ws.rollback(mark)
    if plan is not None:
        # the backfilled job takes some held GPUs: they leave the holds, or the next short job's probe
        # would give them back and place onto them again (a GPU bound twice in one cycle)
        used: dict[int, int] = {}
        for o, m in plan.tasks:
            used[o] = used.get(o, 0) | m
        for i, h in enumerate(ctx.holds):
            if not h.strict and any(used.get(o, 0) & m for o, m in h.tasks):
                left = tuple((o, m & ~used.get(o, 0)) for o, m in h.tasks if m & ~used.get(o, 0))
                for o, m in h.tasks:
                    if m & used.get(o, 0):
                        ws.give(o, m & used[o])  # back to free, so the bind below takes it
                ws.set_hold(i, h._replace(tasks=left))
    if plan is None:
        best = tasks
        if pm is not None and pm[0] == ws.release_epoch and pm[1] == ws.hold_changes:
            best = min(best, pm[2])
        ctx._probe_memo[pkey] = (ws.release_epoch, ws.hold_changes, best)
    return plan


def _quota_ceiling_note(job: PendingJob, size: int, types: list[str], ctx: Ctx) -> str:
    """When the job's queue could never hold ``size`` GPUs of any of its types, even with every other queue
    idle (``QuotaBook.ceiling``), say so: the job waits (as Kueue's inadmissible workloads and Slurm's
    QOS-limited jobs do: the queue file may be raised) but its reason tells that nothing else will free it.
    Empty otherwise. Asked only for a job its quota refuses now."""
    first: tuple[str, int, str] | None = None
    for t in types:
        ceiling = ctx.quota.ceiling(job.queue_name, t)
        least = sharing.least_share(job, t, ctx) if job.gpu_memory_mib is not None else None
        if ceiling is None or ceiling[0] >= job_milli(job, size, least):
            return ""
        first = first or (t, *ceiling)
    if first is None:
        return ""
    t, most, what = first
    held = f"{amount_text(t, most)} {t} GPUs"
    return f"; never fits its quota: queue {job.queue_name} holds at most {held} ({what})"


def _attempt(job: PendingJob, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    """Try to bind ``job``. None when bound, else the status explaining why not.

    Stages: filter -> admit and place (``_admit_and_place``) -> refused by quota (``_quota_refused``) ->
    already preempting (``_still_preempting``) -> why not (``_why_not``) -> make room (``_make_room``)."""
    for f in policy.filters:
        st = f.check(job, ctx)
        if st is not None:
            return st
    # its allowed types the cluster has, in its order of preference (memoized per GPU type for the usual
    # job, which does not list several; the list is shared: read only)
    if job.gpu_types is None:
        types = ctx.types_of.get(job.gpu_type)
        if types is None:
            types = ctx.types_of[job.gpu_type] = job_types(job, ctx.idx)
    else:
        types = job_types(job, ctx.idx)
    # a share, a slice, CPU, memory or a node selector: ``core.sharing`` places it (inline attribute
    # checks: this runs for every waiting job of every cycle)
    if (
        job.gpu_milli is not None
        or job.mig_profile is not None
        or job.cpu_milli
        or job.memory_mib
        or job.node_selector
        or job.tolerations
        or job.affinity
    ):
        return _attempt_with_resources(job, types, policy, ctx, out)
    if job.min_gpus is None and len(types) == 1:
        # one size and one GPU type (most jobs): ``_admit_and_place`` without its lists and loops
        size = job.gpus
        refusal = policy.permit.check(job, types[0], size, ctx)
        if refusal is None:
            plan = _try_place(job, size, types[0], ctx)
            if plan is not None:
                _bind(job, size, plan, ctx, out)
                return None
    else:
        tried = _admit_and_place(job, types, policy, ctx, out)
        if tried is None:
            return None  # bound
        size, refusal = tried
    if refusal is not None:
        return _quota_refused(job, size, types, refusal, policy, ctx, out)
    if ctx.stopping:
        st = _still_preempting(job, size, ctx)
        if st is not None:
            return st
    st = _why_not(job, size, types, ctx)
    if st.code in _WAITS_FOR_ROOM:
        return _make_room(job, size, st, policy, ctx, out)
    return st


def _attempt_with_resources(
    job: PendingJob, types: list[str], policy: Policy, ctx: Ctx, out: _Out
) -> Status | None:
    """``_attempt`` for a job that asks for a GPU fraction, CPU or memory (``sharing``): the first of its
    types that its quota admits and that has the room now. It reserves nothing; a share or slice may evict
    lower-ranked ones (``part_preemption``), and waits while they stop."""
    size = job.gpus
    if job.node_selector and (never := sharing.never_fits(job, types, ctx)) is not None:
        return Status("GangTooLarge", never)
    refusal = None
    admitted = False
    for t in types:
        msg = policy.permit.check(job, t, size, ctx) or _resources_permit(job, policy, ctx)
        if msg is not None:
            refusal = refusal or msg
            continue
        plan = sharing.try_place(job, size, t, ctx)
        share = sharing.side_of(ctx).milli.get(job.id) if job.gpu_memory_mib is not None else None
        if plan is not None and share is not None and (msg := policy.permit.check(job, t, size, ctx, share)):
            refusal = refusal or msg  # its share where it placed is more than its quota admits
            continue
        admitted = True
        if plan is not None:
            _bind(job, size, plan, ctx, out, job_milli(job, size, share))
            sharing.record(job, plan, ctx)
            constraints.record(job, plan, ctx)
            _use_resources(job, plan, ctx)
            if job.mig_profile is not None:  # the Bind names the slice its one task gets
                _note_part(out, mig=sharing.side_of(ctx).slices[job.id])
            elif job.gpu_memory_mib is not None:  # and the share a job asking for GPU memory holds
                _note_part(out, milli=sharing.side_of(ctx).milli[job.id])
            return None
    if refusal is not None and not admitted:
        return Status("QuotaExceeded", refusal + _quota_ceiling_note(job, size, types, ctx))
    victims = ctx.stopping.get(job.id)
    if victims:  # its victims are stopping: it takes their room once they have, ahead of whom it outranks
        n = len(victims)
        return Status(
            "Preempting",
            f"waiting for {n} preempted job{'s' if n != 1 else ''} to stop ({', '.join(victims)})",
        )
    if job.gpu_milli is not None or job.mig_profile is not None:
        pst = part_preemption.preempt_for_part(job, types, policy, ctx, out.preemptions)
        if pst is not None:
            return pst
    else:
        rst = _preempt_for_rules(job, size, types, policy, ctx, out)
        if rst is not None:
            return rst
    return Status("Resources", sharing.why_short(job, types, ctx))


def _preempt_for_rules(
    job: PendingJob, size: int, types: list[str], policy: Policy, ctx: Ctx, out: _Out
) -> Status | None:
    """A whole-GPU gang with placement rules, CPU or memory evicts lower-ranked whole-GPU jobs where they
    make room it may use (``rule_preemption``); its slot is held like a preemptor's."""
    if policy.preemptor is None or ctx.counts["preemptors"] >= ctx.cfg.max_preemptors_per_cycle:
        return None
    for t in types:
        if policy.permit.check(job, t, size, ctx) is not None:
            continue
        found = rule_preemption.victims_for_rules(job, size, t, policy, ctx)
        if found is None:
            continue
        return _evict_and_hold(job, size, t, found, "", policy, ctx, out)
    return None


def _note_part(out: _Out, **part: object) -> None:
    """The last Bind's one task, with what it holds of its GPU (a MIG slice, or a share's thousandths)."""
    bind = out.binds[-1]
    placed = msgspec.structs.replace(bind.placements[0], **part)
    out.binds[-1] = msgspec.structs.replace(bind, placements=(placed,))


def _resources_permit(job: PendingJob, policy: Policy, ctx: Ctx) -> str | None:
    """The queue's CPU and memory quota (``quota.CPU`` / ``MEMORY``) for every task of ``job``."""
    tasks = job.gpus // job.gpus_per_task
    for resource, amount in ((CPU, job.cpu_milli), (MEMORY, job.memory_mib)):
        msg = policy.permit.check(job, resource, amount * tasks, ctx) if amount else None
        if msg is not None:
            return msg
    return None


def _use_resources(job: PendingJob, plan: Plan, ctx: Ctx) -> None:
    """The bound job's CPU and memory join its queue's quota usage for the rest of the cycle."""
    for resource, amount in ((CPU, job.cpu_milli), (MEMORY, job.memory_mib)):
        if amount:
            ctx.ws.add_usage(job.queue_name, resource, amount * len(plan.tasks))


def _admit_and_place(
    job: PendingJob, types: list[str], policy: Policy, ctx: Ctx, out: _Out
) -> tuple[int, str | None] | None:
    """Bind ``job`` at the first size (largest first) and GPU type (its order) that its quota admits and
    that places; None when bound. Else (the smallest size tried, the quota's refusal when the quota
    refuses that size on every type, else None). (``_attempt`` has a fast path for the usual job, one
    size and one GPU type: there a refused permit is refused for all types, as the re-check below would
    find, nothing having changed since.)"""
    quota_msg = None
    sizes = [job.gpus] if job.min_gpus is None else job_sizes(job, ctx)
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
        return size, quota_msg
    return size, None


def _quota_refused(
    job: PendingJob, size: int, types: list[str], refusal: str, policy: Policy, ctx: Ctx, out: _Out
) -> Status:
    """``QuotaExceeded`` (with the ceiling note), unless a quota-aware preemptor makes room in the queue's
    quota (its own queue's lower-ranked jobs, other queues' lower-ranked borrowers); the plan is checked
    against the quota."""
    ctx.quota_blocked.add(job.id)
    never = _quota_ceiling_note(job, size, types, ctx)
    qst = Status("QuotaExceeded", refusal + never)
    if getattr(policy.preemptor, "quota_aware", False) and job.id not in ctx.stopping:
        pst = _preempt(job, size, policy, ctx, out)
        if pst is not None:
            return pst
    if never:
        return qst  # nothing but a new queue file lets it in: that is what to say
    return _short_of_gpus(job, size, types, refusal, ctx) or qst


#: The reasons of a job short of free GPUs that it may wait out (not one that never fits the cluster).
_SHORT_OF_GPUS = frozenset(("Resources", "Reservation", "NodeUnhealthy"))


def _short_of_gpus(job: PendingJob, size: int, types: list[str], refusal: str, ctx: Ctx) -> Status | None:
    """The reason of a job its quota refuses while fewer GPUs than it needs are free: the GPUs bind first
    (quota room it could borrow would not place it), so the reason says that, and the quota's numbers
    after. None when the GPUs are free and the quota alone holds it back."""
    tf = ctx.ws.type_free
    if sum(tf.get(t, 0) for t in types) >= size:
        return None
    st = _why_not(job, size, types, ctx)
    if st.code not in _SHORT_OF_GPUS:
        return None
    return Status(st.code, f"{st.message}; its quota is short too: {refusal}", st.earliest_start)


def _still_preempting(job: PendingJob, size: int, ctx: Ctx) -> Status | None:
    """``Preempting`` for a job whose victims are still stopping and whose slot is held for it."""
    victims = ctx.stopping.get(job.id)
    if victims is None or ctx.hold_of(job.id) is None:
        return None
    n = len(victims)
    return Status(
        "Preempting",
        f"needs {size} GPUs; waiting for {n} preempted job{'s' if n != 1 else ''} to stop "
        f"({', '.join(victims)}); their GPUs are held for it",
    )


def _why_not(job: PendingJob, size: int, types: list[str], ctx: Ctx) -> Status:
    """``reasons.classify`` behind a memo: a reason depends only on the job's shape and the workspace's
    free GPUs and holds, so thousands of waiting jobs of a few shapes share it while nothing is bound in
    between (at cluster level only the free total matters, so the memo survives binds elsewhere)."""
    alts = job.gpu_types
    rkey = (job.gpu_type if alts is None else alts, job.gpus_per_task, size, job.gpus, job.topology_required)
    lvl = ctx.required_level(job) if ctx.consolidate_small else job.topology_required
    if lvl is None or lvl == "cluster":
        tf = ctx.ws.type_free
        if alts is not None:
            free = sum(tf.get(t, 0) for t in types)
        else:
            free = tf.get(job.gpu_type, 0) if job.gpu_type is not None else sum(tf.values())
        stamp = -1 - free
    else:
        stamp = ctx.ws.version
    memo = ctx._reasons.get(rkey)
    held = ctx.ws.hold_changes
    if memo is not None and memo[0] == stamp and memo[1] == held:
        return memo[2]
    st = reasons.classify(job, size, ctx)
    ctx._reasons[rkey] = (stamp, held, st)
    return st


def _make_room(job: PendingJob, size: int, st: Status, policy: Policy, ctx: Ctx, out: _Out) -> Status:
    """For a job waiting for room (``st``): consolidate > preempt > reserve, the first that acts gives the
    status; ``st`` when none does."""
    counts = ctx.counts
    cfg = ctx.cfg
    # (_consolidate's and _preempt's own first tests, asked here: once the cycle's budgets are used up,
    # thousands of waiting jobs skip the calls)
    if (
        st.code == "Topology"
        and cfg.consolidation
        and counts["consolidations"] < cfg.max_consolidations_per_cycle
    ):
        cst = _consolidate(job, size, policy, ctx, out)
        if cst is not None:
            return cst
    if policy.preemptor is not None and counts["preemptors"] < cfg.max_preemptors_per_cycle:
        pst = _preempt(job, size, policy, ctx, out)
        if pst is None and ctx.cluster.parts_on and counts["preemptors"] < cfg.max_preemptors_per_cycle:
            pst = _preempt_shares(job, size, policy, ctx, out)
        if pst is not None:
            return pst
    # reserve: the earliest slot, held (``Reserver``: not called once the cycle's reservations are spent)
    r = policy.reserver
    if r is None or counts["reservations"] >= cfg.max_reservations:
        return st
    h = r.reserve(job, size, job.gpu_type, ctx)  # (a job with gpu_types: the reserver reads them)
    if h is None:
        return st
    _announce(job.id, h.until, h.tasks, ctx, out)
    return Status(
        st.code, st.message + f"; reserved, earliest start in ~{reasons.human(h.until - ctx.now)}", h.until
    )


def _announce(
    job_id: str, start: float | None, tasks: tuple[tuple[int, int], ...], ctx: Ctx, out: _Out
) -> tuple[str, ...]:
    """Record the slot held for ``job_id`` as a ``Reservation`` (its nodes, sorted); returns the nodes."""
    nodes = tuple(sorted({ctx.idx.ids[o] for o, _m in tasks}))
    out.reservations.append(Reservation(job_id=job_id, start_estimate=start, nodes=nodes))
    return nodes


def _consolidate(job: PendingJob, size: int, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    """Allocate > consolidate > reclaim > preempt: move a few small running jobs so a gang that only
    fragmentation blocks can start (see ``consolidation``); its slot is held like a preemptor's."""
    if ctx.counts["consolidations"] >= ctx.cfg.max_consolidations_per_cycle or job.id in ctx.stopping:
        return None
    for t in ctx.job_types(job):
        ctx.ws.bump(ctx.counts, "consolidations")
        cp = plan_consolidation(job, size, t, ctx, running_view(ctx, policy.orderer))
        if cp is None:
            continue
        until = ctx.now + ctx.cfg.preemption_grace_s
        for vid in cp.movers:
            out.preemptions.append(Preemption(victim_id=vid, reason="consolidate", for_job=job.id))
            ctx.ws.put(ctx.preempted, vid, job.id)
        hold(ctx, job.id, until, cp.plan, strict=True)
        nodes = _announce(job.id, until, cp.plan.tasks, ctx, out)
        n = len(cp.movers)
        return Status(
            "Consolidating",
            f"needs {size} GPUs on {len(nodes)} node{'s' if len(nodes) != 1 else ''}; moving {n} small "
            f"job{'s' if n != 1 else ''} ({', '.join(cp.movers)}) to other nodes; "
            f"{reasons.once_stopped(until - ctx.now)}",
            until,
        )
    return None


def _preempt(job: PendingJob, size: int, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    pre = policy.preemptor
    if pre is None or ctx.counts["preemptors"] >= ctx.cfg.max_preemptors_per_cycle:
        return None
    rank = policy.orderer.rank(job, ctx)
    for t in ctx.job_types(job):
        if not ctx.quota.within_nominal(ctx.ws, job.queue_name, t, size * GPU_MILLI) and (
            running_view(ctx, policy.orderer).min_rank() >= rank
        ):
            continue  # nothing ranks lower and no guaranteed quota to reclaim: skip the scan
        ctx.ws.bump(ctx.counts, "preemptors")
        pp = pre.plan(job, size, t, rank, ctx, running_view(ctx, policy.orderer))
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
            ctx.ws.put(ctx.preempted, c.job.id, job.id)
            ctx.ws.bump(ctx.evicted, (c.job.queue_name, t), c.gpus * GPU_MILLI)  # whole-GPU victims
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
        # strict: the GPUs the victims free are promised to this job alone (no backfill onto them)
        hold(ctx, job.id, until, pp.plan, strict=True)
        _announce(job.id, until, pp.plan.tasks, ctx, out)
        # a gang shrunk by several tasks is several candidates: named once, as shrunk, not preempted
        shrunk = list(dict.fromkeys(c.job.id for c in pp.victims if c.kind == 0))
        evicted = list(dict.fromkeys(c.job.id for c in pp.victims if c.kind != 0))
        return Status(
            "Preempting",
            f"needs {size} GPUs; {reasons.making_room(shrunk, evicted)}; "
            f"{reasons.once_stopped(until - ctx.now)}",
            until,
        )
    return None


def _preempt_shares(job: PendingJob, size: int, policy: Policy, ctx: Ctx, out: _Out) -> Status | None:
    """A whole-GPU gang the planner found no room for evicts the shares of GPUs it outranks every share of
    (``part_preemption.preempt_for_gang``); its slot is held like a preemptor's."""
    for t in ctx.job_types(job):
        found = part_preemption.preempt_for_gang(job, size, t, policy, ctx)
        if found is None:
            continue
        return _evict_and_hold(job, size, t, found, " on shared GPUs", policy, ctx, out)
    return None


def _evict_and_hold(
    job: PendingJob,
    size: int,
    t: str,
    found: tuple[list[str], Plan],
    where: str,
    policy: Policy,
    ctx: Ctx,
    out: _Out,
) -> Status:
    """Ask ``found``'s victims to stop for ``job`` and hold its slot strictly while they do."""
    victims, plan = found
    ctx.ws.bump(ctx.counts, "preemptors")
    part_preemption.evict(job, victims, t, policy, ctx, out.preemptions)
    until = ctx.now + ctx.cfg.preemption_grace_s
    hold(ctx, job.id, until, plan, strict=True)
    _announce(job.id, until, plan.tasks, ctx, out)
    return Status(
        "Preempting",
        f"needs {size} GPUs; {reasons.making_room([], victims)}{where}; "
        f"{reasons.once_stopped(until - ctx.now)}",
        until,
    )


def _hold_for_stopping_victims(snapshot: Snapshot, ctx: Ctx, out: _Out) -> None:
    """Stateless protection of earlier preemptions: running jobs with ``preempting_for`` set are stopping
    for that job. They are never victims again nor releases for anyone else, and each such preemptor that
    is still pending gets its slot recomputed on (free GPUs + its victims' GPUs) with the free part held
    strictly for it, so GPUs its victims have already released go to nobody else."""
    cols = ctx.cluster.cols
    if not cols.n or not cols.stopping[: cols.n].any():
        return
    running = ctx.cluster.running
    for s in sorted(cols.ids[i] for i in np.flatnonzero(cols.stopping[: cols.n]).tolist()):
        rj = running[s]
        assert rj.preempting_for is not None
        ctx.ws.put(ctx.preempted, s, rj.preempting_for)
        ctx.stopping.setdefault(rj.preempting_for, []).append(s)
        ctx.ws.bump(ctx.evicted, (rj.queue_name, ctx.cluster.job_gpu_type(rj)), running_milli(rj))
    pending = {j.id: j for j in snapshot.pending if j.id in ctx.stopping}
    ws = ctx.ws
    ord_of = ctx.idx.ord_of
    until = ctx.now + ctx.cfg.preemption_grace_s
    for pid in sorted(pending):
        job = pending[pid]
        if job.gpu_milli is not None or job.mig_profile is not None:
            continue  # a share's or slice's preemptor holds nothing: it takes the room as it frees
        if _placed_by_sharing(job):  # a gang with placement rules, CPU or memory: its own placement
            rules_plan = _rules_slot(job, ctx.stopping[pid], ctx)
            if rules_plan is not None:
                hold(ctx, pid, until, rules_plan, strict=True)
                _announce(pid, None, rules_plan.tasks, ctx, out)
            continue
        mark = ws.mark()
        for vid in ctx.stopping[pid]:
            for n, m in ctx.cluster.job_masks[vid]:
                ws.give(ord_of[n], m)
        if ctx.cluster.parts_on:  # shared GPUs whose every share stops for it (``_preempt_shares``)
            for o, g in part_preemption.shares_stopping_for(pid, ctx):
                ws.give(o, 1 << g)
        plan = None
        # a job with several allowed types tries them in its order (gpu_type None: every type at once)
        tries: list[str | None] = [job.gpu_type] if job.gpu_types is None else list(ctx.job_types(job))
        for size in job_sizes(job, ctx):
            for t in tries:
                plan = place(
                    ws, size // job.gpus_per_task, job.gpus_per_task, t, ctx.required_level(job),
                    ctx.cfg.first_fit,
                )  # fmt: skip
                if plan is not None:
                    break
            if plan is not None:
                break
        ws.rollback(mark)
        if plan is None:
            continue  # its victims no longer make room: it is treated like any other waiting job
        hold(ctx, pid, until, plan, strict=True)
        _announce(pid, None, plan.tasks, ctx, out)


def _placed_by_sharing(job: PendingJob) -> bool:
    """A whole-GPU gang ``_attempt`` sends to ``_attempt_with_resources`` (its inline test, spelled out)."""
    return bool(job.cpu_milli or job.memory_mib or constraints.constrained(job))


def _rules_slot(job: PendingJob, victims: list[str], ctx: Ctx) -> Plan | None:
    """The slot of a rules preemptor whose ``victims`` are stopping: its own placement on the room they
    leave (``rule_preemption.freed``), in its order of GPU types."""
    with rule_preemption.freed(ctx, victims):
        for t in ctx.job_types(job):
            plan = sharing.try_place(job, job.gpus, t, ctx)
            if plan is not None:
                return plan
    return None


def run_cycle(snapshot: Snapshot, policy: Policy) -> Decisions:
    ctx = Ctx(snapshot, policy.config)
    out = _Out()
    _hold_for_stopping_victims(snapshot, ctx, out)
    waiting = 0
    head: PendingJob | None = None
    stop_at_first_block = policy.config.stop_at_first_block
    reason = out.pending.append
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
        msg = f"{st.message}; {waiting} job{'s' if waiting != 1 else ''} ahead"
        reason(
            PendingReason(
                job_id=job.id, code=st.code, message=msg, position=waiting, earliest_start=st.earliest_start
            )
        )
        waiting += 1
        if stop_at_first_block:
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
