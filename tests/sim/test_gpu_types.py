"""A workload ``gpu_type`` "A|B" reaches the core as ``PendingJob.gpu_types`` (not narrowed to one type)."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.sim.cluster import cluster_from_obj
from rallypoint.sim.engine import SimOptions, Simulator
from rallypoint.sim.run import resolve_policy
from rallypoint.sim.workload import Job

# one 8-GPU node of type A (ar000-n00) and one of type B (br000-n00)
TWO_TYPES: dict[str, Any] = {
    "generator": [
        {"racks": 1, "nodes_per_rack": 1, "gpus_per_node": 8, "gpu_type": "A", "prefix": "a"},
        {"racks": 1, "nodes_per_rack": 1, "gpus_per_node": 8, "gpu_type": "B", "prefix": "b"},
    ]
}


def J(id: str, submit: float, gpus: int, dur: float, gpu_type: str | None) -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=dur, team="t", gpu_type=gpu_type)


def run(jobs: list[Job], policy: str) -> Any:
    return Simulator(
        jobs, cluster_from_obj(TWO_TYPES), policy, None, SimOptions(), policy_obj=resolve_policy(policy)
    ).run()


@pytest.mark.parametrize("policy", ["fifo", "easy-backfill", "rallypoint"])
def test_alternatives_bind_on_the_first_allowed_type_with_room(policy: str) -> None:
    jobs = [
        J("a1", 0, 8, 100, "A|B"),  # A is free: A
        J("a2", 0, 8, 50, "A|B"),  # A taken: B (narrowing to one type would have made it wait for a1)
        J("b1", 10, 8, 30, "B|A"),  # both busy: B frees first (50)
        J("z1", 20, 4, 10, "Z|A"),  # Z is not in the cluster: A only, free at 100
        J("yz", 30, 1, 10, "Y|Z"),  # no allowed type in the cluster: rejected
    ]
    res = run(jobs, policy)
    by = {r.id: r for r in res.records}
    assert {k: (r.start, r.placed_gpu_type) for k, r in by.items()} == {
        "a1": (0, "A"),
        "a2": (0, "B"),
        "b1": (50, "B"),
        "z1": (100, "A"),
    }
    assert res.summary["rejected"] == 1 and res.unfinished == []  # yz
    for r in res.records:
        assert r.gpu_type is not None and r.placed_gpu_type in r.gpu_type.split("|")
