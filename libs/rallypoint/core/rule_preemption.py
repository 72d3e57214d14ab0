"""Preemption for a whole-GPU gang with placement rules or CPU and memory requests (``core.sharing`` places
such a gang: a node selector, tolerations, affinity, CPU or memory per task).

The whole-GPU planner (``core.preemption``) plans over every schedulable node and knows nothing of a node's
labels, taints, CPU or memory, so such a gang used to wait for free room however high its priority. Here it
evicts running whole-GPU jobs the planner itself could evict for it (its eligibility and cost order), and
only where that helps:

- candidates are the policy preemptor's own (``RankPreemptor.eligible``: reclaim of borrowed quota, then
  lower classes, then the same class with more attained service, unprotected, each in the planner's cost
  order), skipping those with no task on a node the gang may use;
- their GPUs (and their tasks' CPU and memory) are given back inside a transaction, one candidate at a
  time, until the gang's own placement (``sharing.try_place``: its rules, its CPU and memory) finds room;
- the chosen set is then pruned, most expensive first, while the gang still fits, so no victim is evicted
  that the placement does not need.

At most ``MAX_CANDIDATES`` candidates are looked at per gang and GPU type, so a cycle's cost stays bounded on
a large cluster. The gang then holds its slot strictly while its victims stop, as a planner's preemptor does
(``engine._hold_for_stopping_victims`` recomputes it with the same placement).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rallypoint.core import constraints, sharing
from rallypoint.core.preemption import running_view

if TYPE_CHECKING:
    from rallypoint.core.context import Ctx
    from rallypoint.core.placement import Plan
    from rallypoint.core.policies import Policy
    from rallypoint.core.types import PendingJob

__all__ = ["MAX_CANDIDATES", "freed", "victims_for_rules"]

#: Candidates looked at per gang and GPU type (cost order): enough for any gang of a few nodes, bounded so a
#: selector matching few nodes never walks every running job of a 100k-GPU cluster.
MAX_CANDIDATES = 256


@contextmanager
def freed(ctx: Ctx, victims: Sequence[str]) -> Iterator[None]:
    """Inside: the workspace and the cycle's CPU and memory as if ``victims`` had stopped; restored after."""
    ws, side, ord_of = ctx.ws, sharing.side_of(ctx), ctx.idx.ord_of
    running = ctx.cluster.running
    mark = ws.mark()
    given: list[tuple[int, int, int]] = []
    for vid in victims:
        rj = running[vid]
        for node_id, mask in ctx.cluster.job_masks[vid]:
            o = ord_of[node_id]
            ws.give(o, mask)
            side.cpu_left[o] += rj.cpu_milli
            side.mem_left[o] += rj.memory_mib
            given.append((o, rj.cpu_milli, rj.memory_mib))
    try:
        yield
    finally:
        ws.rollback(mark)
        for o, cpu, mem in given:
            side.cpu_left[o] -= cpu
            side.mem_left[o] -= mem


def _fits(job: PendingJob, size: int, t: str, victims: Sequence[str], ctx: Ctx) -> Plan | None:
    with freed(ctx, victims):
        return sharing.try_place(job, size, t, ctx)


def _candidates(job: PendingJob, size: int, t: str, policy: Policy, ctx: Ctx) -> list[tuple[str, int]]:
    """The jobs the policy's preemptor may evict for ``job`` (its own eligibility: reclaim of borrowed
    quota, lower classes, the same class with more attained service, each unprotected, in cost order) that
    have GPUs of type ``t`` on nodes the job may use, with those GPUs; at most ``MAX_CANDIDATES``."""
    eligible = getattr(policy.preemptor, "eligible", None)
    if eligible is None:  # a plug-in preemptor without it: no rules preemption under it
        return []
    view = running_view(ctx, policy.orderer)
    allowed = constraints.allowed_nodes(job, ctx)
    idx = ctx.idx
    out: list[tuple[str, int]] = []
    for jid in eligible(job, size, t, policy.orderer.rank(job, ctx), ctx, view):
        useful = sum(
            m.bit_count()
            for o, m in ((idx.ord_of[n], m) for n, m in ctx.cluster.job_masks[jid])
            if idx.type_of[o] == t and (allowed is None or allowed[o])
        )
        if useful:
            out.append((jid, useful))
            if len(out) >= MAX_CANDIDATES:
                break
    return out


def _free_allowed(job: PendingJob, t: str, ctx: Ctx) -> int:
    """Free GPUs of type ``t`` on healthy nodes the job may use (an upper bound on what it can place now)."""
    allowed = constraints.allowed_nodes(job, ctx)
    idx, ws = ctx.idx, ctx.ws
    return sum(
        ws.free[o].bit_count()
        for o, n in enumerate(idx.nodes)
        if idx.type_of[o] == t and n.schedulable and (allowed is None or allowed[o])
    )


def victims_for_rules(
    job: PendingJob, size: int, t: str, policy: Policy, ctx: Ctx
) -> tuple[list[str], Plan] | None:
    """The victims, cheapest first, that let ``job`` place ``size`` GPUs of type ``t`` under its rules, and
    that placement; None when evicting every candidate still leaves no room."""
    short = size - _free_allowed(job, t, ctx)
    chosen: list[str] = []
    plan = None
    for vid, gpus in _candidates(job, size, t, policy, ctx):
        chosen.append(vid)
        short -= gpus
        if short <= 0 and (plan := _fits(job, size, t, chosen, ctx)) is not None:
            break
    if plan is None:
        return None
    for vid in reversed(list(chosen)):  # prune, most expensive first
        rest = [v for v in chosen if v != vid]
        smaller = _fits(job, size, t, rest, ctx) if rest else None
        if smaller is not None:
            chosen, plan = rest, smaller
    return chosen, plan
