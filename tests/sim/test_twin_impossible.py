"""Impossible jobs (issue 19 item 5) are rejected the same way in the simulator and live: the core's
``GangTooLarge`` (a GPU type no node has, a task larger than any node) becomes the scheduler's
``JobRejected`` and the simulator's rejection, at the same instant, and every decision around them agrees
byte for byte (``rallypoint.sim.twin``), with a queue file whose org limit holds one team."""

from __future__ import annotations

import pytest

from rallypoint.scheduling.queues import queues_from_obj
from rallypoint.sim.cluster import cluster_from_obj
from rallypoint.sim.twin import run_twin
from rallypoint.sim.workload import Job

QUEUES = {
    "cohorts": [{"name": "all"}],
    "orgs": [{"name": "research", "limit": 8}],
    "teams": [
        {"name": "t1", "nominal": 16, "cohort": "all", "parent": "research"},
        {"name": "t2", "nominal": 16, "cohort": "all"},
    ],
}


def J(id: str, submit: float, gpus: int, team: str, **kw: object) -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=50.0, team=team, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["fifo", "rallypoint"])
def test_impossible_jobs_are_rejected_alike_and_the_rest_decided_alike(policy: str) -> None:
    jobs = [
        J("fits", 0.0, 8, "t2"),
        J("typed", 1.0, 8, "t2", gpu_type="B200"),  # no node has it
        J("wide", 2.0, 16, "t2", gpus_per_task=16),  # a task larger than any node (8 GPUs)
        J("capped-1", 3.0, 8, "t1"),
        J("capped-2", 4.0, 8, "t1"),  # waits on research's limit (8), then runs
        J("after", 5.0, 8, "t2"),
    ]
    cluster = cluster_from_obj({"generator": {"racks": 1, "nodes_per_rack": 4, "gpus_per_node": 8}})
    report = run_twin(jobs, cluster, policy, queues_from_obj(QUEUES))
    first = report.mismatches[0] if report.mismatches else None
    assert first is None, f"t={first.now}:\n sim   {first.sim}\n live  {first.live}\n audit {first.audit}"
    assert report.ignored_binds == 0 and report.stale_decisions == 0
    assert report.rejected_sim == report.rejected_live == ["typed", "wide"]
    assert report.binds >= 4
