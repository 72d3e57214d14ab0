"""The workspace journal undoes everything: free GPUs and quota usage, and also the cycle's holds and
its counters and maps (preemptions, consolidations and reservations used, victims, GPUs being evicted).

A rolled-back attempt leaves the workspace and the per-cycle state exactly as they were."""

from __future__ import annotations

import copy
from typing import Any

from rallypoint.core import PendingJob, PriorityClass, RunningJob, Snapshot, policy_by_name
from rallypoint.core.backfill import hold
from rallypoint.core.context import Ctx
from rallypoint.core.engine import _attempt, _Out
from rallypoint.core.placement import new_plan
from rallypoint.core.workspace import Hold

from .builders import cluster, nodes, pending, running

CLASSES = (
    PriorityClass(name="production", value=1000),
    PriorityClass(name="best-effort", value=100),
)


def _state(ctx: Ctx) -> dict[str, Any]:
    ws = ctx.ws
    return copy.deepcopy(
        {
            "free": list(ws.free),
            "type_free": dict(ws.type_free),
            "usage": dict(ws.usage),
            "stamps": (ws.version, ws.release_epoch, ws.usage_version, ws.hold_changes),
            "holds": list(ws.holds),
            "hold_ids": set(ws.hold_ids),
            "counts": dict(ctx.counts),
            "preempted": dict(ctx.preempted),
            "evicted": dict(ctx.evicted),
        }
    )


def _ctx(jobs: list[RunningJob], pend: list[PendingJob]) -> Ctx:
    snap = Snapshot(
        now=10_000.0,
        cluster=cluster(nodes(racks=1, per_rack=2), jobs),
        pending=tuple(pend),
        priority_classes=CLASSES,
    )
    return Ctx(snap, policy_by_name("rallypoint").config)


def test_rollback_undoes_holds_counters_and_maps() -> None:
    ctx = _ctx([], [])
    ws = ctx.ws
    hold(ctx, "early", 50.0, new_plan("h100", "node", ((1, 0b11),)))
    before = _state(ctx)
    mark = ws.mark()
    h = hold(ctx, "a", 100.0, new_plan("h100", "node", ((0, 0b1111),)), strict=True)
    ws.set_hold(0, ws.holds[0]._replace(tasks=((1, 0b1),)))
    ws.remove_hold(h)
    ws.add_hold(Hold("b", 200.0, ((0, 0b10000),)))
    ws.bump(ctx.counts, "preemptors")
    ws.bump(ctx.counts, "reservations", 2)
    ws.put(ctx.preempted, "victim", "a")
    ws.bump(ctx.evicted, ("q", "h100"), 8)
    ws.add_usage("q", "h100", 8)
    assert _state(ctx) != before
    ws.rollback(mark)
    assert _state(ctx) == before
    assert ctx.hold_of("a") is None and ctx.hold_of("early") is not None


def test_rolled_back_preemption_attempt_leaves_everything_as_it_was() -> None:
    victim = running(
        "be", {"s0r0n0": tuple(range(8)), "s0r0n1": tuple(range(8))}, gpus_per_task=8,
        priority_class="best-effort", team="other",
    )  # fmt: skip
    job = pending("prod", 16, 8, priority_class="production", submit=9_000.0)
    ctx = _ctx([victim], [job])
    policy = policy_by_name("rallypoint")
    before = _state(ctx)
    mark = ctx.ws.mark()
    out = _Out()
    st = _attempt(job, policy, ctx, out)
    assert st is not None and st.code == "Preempting", st
    assert [p.victim_id for p in out.preemptions] == ["be"]
    assert ctx.counts["preemptors"] == 1 and ctx.preempted == {"be": "prod"} and ctx.hold_of("prod")
    ctx.ws.rollback(mark)
    assert _state(ctx) == before
    # and the same attempt again decides the same
    out2 = _Out()
    assert _attempt(job, policy, ctx, out2) == st
    assert out2.preemptions == out.preemptions and out2.reservations == out.reservations
