"""Where a job may run: node selectors, taints and tolerations, affinity and anti-affinity between jobs.

- **Node selector** (``PendingJob.node_selector``): every task's node has all of these labels.
- **Taints** (``Node.taints``, ``key=value`` or ``key``): a tainted node is closed to every job
  (``ClusterIndex.sched`` counts it unschedulable, so no placement, reservation or preemption plan of the
  usual path ever sees it), except to a job whose ``tolerations`` match every taint of the node: a toleration
  ``key=value`` matches that taint, a bare ``key`` matches the key with any value. Such a job opens the
  nodes it tolerates inside a transaction (``Workspace.open_node``) while it is placed.
- **Affinity** (``PendingJob.affinity``): rules between jobs of one team, by group. A job naming a group is
  a member of it; an ``anti`` rule keeps its tasks off every node (or rack) holding another running member
  (two replicas of a service never in one rack), an affinity rule keeps them on nodes (or racks) holding
  one, anywhere while none runs. Members bound earlier in the same cycle count (``record``), so two
  replicas bound in one cycle still spread.

The engine sends a job with any of these through ``core.sharing`` (which places on free room only: such a
job reserves nothing and preempts nothing, ``docs/api.md`` "Placement rules"); a job without them
never pays for this module. Everything here reads the cycle's snapshot only: same log in, same answer out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rallypoint.core.context import Ctx
    from rallypoint.core.placement import Plan
    from rallypoint.core.types import Affinity, Node, PendingJob

__all__ = [
    "allowed_nodes",
    "constrained",
    "node_admits",
    "open_tolerated",
    "record",
    "tolerates",
    "why_excluded",
]


def constrained(job: PendingJob) -> bool:
    """Whether the job has any rule of this module."""
    return bool(job.node_selector or job.tolerations or job.affinity)


def tolerates(tolerations: tuple[str, ...], taints: tuple[str, ...]) -> bool:
    """Every taint is matched: by the same ``key=value`` or by its bare key."""
    return all(t in tolerations or t.partition("=")[0] in tolerations for t in taints)


def node_admits(node: Node, node_selector: Iterable[tuple[str, str]], tolerations: tuple[str, ...]) -> bool:
    """Whether a job with this selector and these tolerations may have a task on ``node`` (health
    aside): the repair of a gang's lost tasks asks it of each candidate node."""
    return set(node_selector) <= set(node.labels) and tolerates(tolerations, node.taints)


def allowed_nodes(job: PendingJob, ctx: Ctx) -> list[bool] | None:
    """Per node ordinal, whether the job's rules allow the node (None: every node). Tainted nodes are
    allowed only when tolerated; their schedulability is still ``open_tolerated``'s business."""
    if not constrained(job):
        return None
    base = _static_allowed(job, ctx)
    if not job.affinity:
        return base
    allowed = list(base)
    for rule in job.affinity:
        _apply(rule, job, allowed, ctx)
    return allowed


def _static_allowed(job: PendingJob, ctx: Ctx) -> list[bool]:
    """The selector and the taints, memoized per (selector, tolerations) for the cycle."""
    memo = ctx.cache.setdefault("node_rules", {})
    assert isinstance(memo, dict)
    key = (job.node_selector, job.tolerations)
    hit = memo.get(key)
    if hit is None:
        wanted = set(job.node_selector)
        hit = memo[key] = [
            wanted <= set(n.labels) and (not n.taints or tolerates(job.tolerations, n.taints))
            for n in ctx.idx.nodes
        ]
    assert isinstance(hit, list)
    return hit


def _domains(rule: Affinity, job: PendingJob, ctx: Ctx) -> set[int]:
    """The domains (node ordinals, or rack indices) of the group's other running members."""
    idx = ctx.idx
    members = ctx.cluster.group_nodes.get((job.team, rule.group), {})
    ords = {idx.ord_of[n] for jid, nodes in members.items() if jid != job.id for n in nodes}
    this_cycle = _cycle_members(ctx).get((job.team, rule.group), {})
    ords.update(o for jid, bound in this_cycle.items() if jid != job.id for o in bound)
    return ords if rule.level == "node" else {idx.rack_of[o] for o in ords}


def _apply(rule: Affinity, job: PendingJob, allowed: list[bool], ctx: Ctx) -> None:
    taken = _domains(rule, job, ctx)
    if not taken and not rule.anti:
        return  # the first member of a group goes anywhere
    of = ctx.idx.rack_of if rule.level == "rack" else range(len(allowed))
    for o, d in enumerate(of):
        if (d in taken) == rule.anti:
            allowed[o] = False


def _cycle_members(ctx: Ctx) -> dict[tuple[str, str], dict[str, tuple[int, ...]]]:
    """Members bound earlier in this cycle: (team, group) -> {job id: node ordinals}."""
    bound = ctx.cache.setdefault("group_binds", {})
    assert isinstance(bound, dict)
    return bound


def record(job: PendingJob, plan: Plan, ctx: Ctx) -> None:
    """The bound job joins its groups for the rest of the cycle."""
    if not job.affinity:
        return
    ords = tuple(o for o, _m in plan.tasks)
    bound = _cycle_members(ctx)
    for rule in job.affinity:
        bound.setdefault((job.team, rule.group), {})[job.id] = ords


def open_tolerated(job: PendingJob, allowed: list[bool] | None, ctx: Ctx) -> None:
    """Open the healthy tainted nodes the job tolerates and its rules allow (inside the caller's
    transaction: ``Workspace.rollback`` closes them again)."""
    if not job.tolerations:
        return
    idx, ws = ctx.idx, ctx.ws
    for o in idx.tainted:
        if idx.nodes[o].schedulable and (allowed is None or allowed[o]):
            ws.open_node(o)


def why_excluded(job: PendingJob, allowed: list[bool] | None, types: list[str], ctx: Ctx) -> str | None:
    """When the job's rules leave no node of its types at all, which rule does: a reason naming it."""
    if allowed is None:
        return None
    idx = ctx.idx
    if any(ok and idx.type_of[o] in types for o, ok in enumerate(allowed)):
        return _too_few(job, types, ctx)
    if job.node_selector and not any(set(job.node_selector) <= set(n.labels) for n in idx.nodes):
        wanted = ", ".join(f"{k}={v}" for k, v in job.node_selector)
        return f"no node has the labels of its node selector ({wanted})"
    for rule in job.affinity:
        taken = _domains(rule, job, ctx)
        if rule.anti and taken:
            return (
                f"anti-affinity {rule.group}:{rule.level}: every {rule.level} it may use holds a running "
                f"member of {rule.group}"
            )
        if not rule.anti and taken:
            return (
                f"affinity {rule.group}:{rule.level}: no {rule.level} holding a member of {rule.group} is "
                "open to it"
            )
    tainted = sorted({t for o in idx.tainted for t in idx.nodes[o].taints})
    return f"no node of its types is open to it (node selector, taints {', '.join(tainted) or 'none'})"


def _too_few(job: PendingJob, types: list[str], ctx: Ctx) -> str | None:
    """A whole-GPU gang larger than every GPU its selector and taints leave it, healthy or not: it waits
    (an operator may change the nodes' labels or taints) with a reason that says so."""
    if job.gpu_milli is not None or job.mig_profile is not None or not (job.tolerations or ctx.idx.tainted):
        return None
    idx = ctx.idx
    static = _static_allowed(job, ctx)
    has = sum(idx.full[o].bit_count() for o, ok in enumerate(static) if ok and idx.type_of[o] in types)
    if has >= job.gpus:
        return None
    tainted = sorted({t for o in idx.tainted for t in idx.nodes[o].taints})
    return (
        f"asks for {job.gpus} GPUs; the nodes open to it (taints {', '.join(tainted)} need a toleration) "
        f"have {has}"
    )
