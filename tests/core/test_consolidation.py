"""Table-driven tests of consolidation (allocate > consolidate > reclaim > preempt): a gang blocked only by
fragmentation has a few small running jobs moved so that it fits."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.core import Snapshot, policy_by_name, schedule

from .builders import cluster, nodes, pending, running

N2 = nodes(racks=1, per_rack=2)  # s0r0n0, s0r0n1: 16 GPUs
N4 = nodes(racks=1, per_rack=4)
NOW = 10_000.0
LO, HI = (0, 1, 2, 3), (4, 5, 6, 7)

CASES: list[dict[str, Any]] = [
    dict(
        id="one-mover-completes-a-node-for-a-blocked-gang",
        # 8 GPUs free, 4 per node: an 8-GPU task fits nowhere until c moves into n0's free half
        cluster=cluster(
            N2,
            [
                running("a", {"s0r0n0": (0, 1)}),
                running("b", {"s0r0n0": (2, 3)}),
                running("c", {"s0r0n1": LO}),
            ],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Consolidating"},
        preempts={"c": "consolidate"},
        held={"big": {"s0r0n1"}},
    ),
    dict(
        id="a-higher-class-job-is-never-moved",
        cluster=cluster(
            N2,
            [
                running("a", {"s0r0n0": (0, 1)}),
                running("b", {"s0r0n0": (2, 3)}),
                running("c", {"s0r0n1": LO}, priority_class="training-high"),
            ],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Consolidating"},
        preempts={"a": "consolidate", "b": "consolidate"},
        held={"big": {"s0r0n0"}},
    ),
    dict(
        id="recently-started-jobs-are-not-moved",
        cluster=cluster(
            N2,
            [
                running("a", {"s0r0n0": LO}, start_time=NOW - 60),
                running("c", {"s0r0n1": LO}, start_time=NOW - 60),
            ],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Topology"},
        preempts={},
    ),
    dict(
        id="no-move-when-the-gang-fits-as-it-is",
        cluster=cluster(N2, [running("a", {"s0r0n0": (0, 1)})]),
        pending=[pending("big", 8)],
        binds={"big"},
        preempts={},
    ),
    dict(
        id="two-task-gang-gets-two-nodes-completed",
        # 16 free GPUs, 4 per node; two 8-GPU tasks need two whole nodes: two movers into the others' halves
        cluster=cluster(
            N4,
            [
                running("a", {"s0r0n0": LO}),
                running("b", {"s0r0n1": LO}),
                running("c", {"s0r0n2": LO}),
                running("d", {"s0r0n3": LO}),
            ],
        ),
        pending=[pending("big", 16)],
        waits={"big": "Consolidating"},
        preempts={"a": "consolidate", "b": "consolidate"},
        held={"big": {"s0r0n0", "s0r0n1"}},
    ),
    dict(
        id="a-multi-task-job-is-never-a-mover",
        overrides={"preemption": False},  # (else the long-running gang is a LAS victim)
        cluster=cluster(
            N2,
            [running("gang", {"s0r0n0": LO, "s0r0n1": LO})],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Topology"},
        preempts={},
    ),
    dict(
        id="the-mover-losing-least-work-is-chosen",
        # either node can be completed by one mover that fits on the other; b (2 GPUs) loses less work
        # since its checkpoint than a (6 GPUs)
        cluster=cluster(
            N2,
            [
                running("a", {"s0r0n0": (0, 1, 2, 3, 4, 5)}),
                running("b", {"s0r0n1": (0, 1)}),
            ],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Consolidating"},
        preempts={"b": "consolidate"},
        held={"big": {"s0r0n1"}},
    ),
    dict(
        id="no-move-when-a-mover-would-fit-nowhere-else",
        # 8 GPUs free (2 + 2 + 4) but completing any node leaves its mover (6, 6 or 4 GPUs) no node
        # with room; (preemption off: else the long-running jobs are LAS victims)
        overrides={"preemption": False},
        cluster=cluster(
            nodes(racks=1, per_rack=3),
            [
                running("a", {"s0r0n0": (0, 1, 2, 3, 4, 5)}),
                running("b", {"s0r0n1": (0, 1, 2, 3, 4, 5)}),
                running("c", {"s0r0n2": LO}),
            ],
        ),
        pending=[pending("big", 8)],
        waits={"big": "Topology"},
        preempts={},
    ),
    dict(
        id="switched-off-by-configuration",
        overrides={"consolidation": False, "preemption": False},
        cluster=cluster(N2, [running("c", {"s0r0n1": LO}), running("a", {"s0r0n0": HI})]),
        pending=[pending("big", 8)],
        waits={"big": "Topology"},
        preempts={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_consolidation(case: dict[str, Any]) -> None:
    policy = policy_by_name("rallypoint", case.get("overrides", {}))
    snap = Snapshot(now=NOW, cluster=case["cluster"], pending=tuple(case["pending"]))
    d = schedule(snap, policy)
    binds = {b.job_id for b in d.binds}
    waits = {r.job_id: r for r in d.pending}
    assert binds | set(waits) == {j.id for j in case["pending"]}
    if "binds" in case:
        assert binds == set(case["binds"]), (d.binds, d.pending)
    for jid, code in case.get("waits", {}).items():
        assert jid in waits, f"{jid} was bound"
        assert waits[jid].code == code, waits[jid]
    assert {p.victim_id: p.reason for p in d.preemptions} == case["preempts"], d.preemptions
    for jid, held in case.get("held", {}).items():
        res = [r for r in d.reservations if r.job_id == jid]
        assert res and set(res[0].nodes) == held, d.reservations
    assert all(p.for_job in waits for p in d.preemptions)
    d2 = schedule(Snapshot(now=snap.now, cluster=snap.cluster, pending=snap.pending[::-1]), policy)
    assert d2 == d


def test_movers_restart_elsewhere_and_the_gang_then_fits() -> None:
    """The whole move, as the scheduler service and the simulator carry it out: the movers stop, go back
    to the queue, and the next cycle binds the gang on the held node and every mover on other GPUs."""
    c = cluster(
        N2,
        [running("a", {"s0r0n0": (0, 1)}), running("b", {"s0r0n0": (2, 3)}), running("c", {"s0r0n1": LO})],
    )
    policy = policy_by_name("rallypoint")
    big = pending("big", 8)
    d = schedule(Snapshot(now=NOW, cluster=c, pending=(big,)), policy)
    assert [p.victim_id for p in d.preemptions] == ["c"]
    rj = c.unbind("c")
    moved = pending("c", rj.gpus, submit=rj.start_time, last_preempted_at=NOW)
    d2 = schedule(Snapshot(now=NOW + 1, cluster=c, pending=(moved, big)), policy)
    bound = {b.job_id: b for b in d2.binds}
    assert set(bound) == {"big", "c"}, d2.pending
    assert {p.node_id for p in bound["big"].placements} == {"s0r0n1"}
    assert {p.node_id for p in bound["c"].placements} == {"s0r0n0"}
