"""The twin (``tests/sim/test_twin.py``) for placement constraints (issue 35 item 6): taints and
tolerations, affinity and anti-affinity between jobs decide byte for byte the same in the simulator and
through the live fold and bridge."""

from __future__ import annotations

import random

import msgspec
import pytest
from test_twin import POLICIES, assert_identical, seeded, synthetic

from rallypoint.events import Affinity
from rallypoint.sim.cluster import Cluster, cluster_from_obj
from rallypoint.sim.twin import Twin
from rallypoint.sim.workload import Job


def racks_with_a_tainted_pool() -> Cluster:
    """Three racks of two 8-GPU nodes; the last rack is tainted pool=serve."""
    return cluster_from_obj(
        {
            "nodes": [
                {
                    "id": f"n{i}",
                    "rack": f"r{i // 2}",
                    "gpus": 8,
                    **({"taints": ["pool=serve"]} if i >= 4 else {}),
                }
                for i in range(6)
            ]
        }
    )


def with_rules(seed: int) -> list[Job]:
    """The seeded contention, with replicas of two groups that spread over racks or stick to a node,
    and jobs that tolerate the tainted pool."""
    rng = random.Random(seed)
    jobs = []
    for job in seeded(seed):
        roll = rng.random()
        if roll < 0.25 and job.gpus <= 8 and job.min_gpus is None:
            rule = Affinity(group="web", level="rack", anti=True)
            job = msgspec.structs.replace(job, affinity=(rule,), tolerations=("pool",))
        elif roll < 0.4 and job.gpus <= 4 and job.min_gpus is None:
            job = msgspec.structs.replace(job, affinity=(Affinity(group="cache", level="node"),))
        elif roll < 0.55:
            job = msgspec.structs.replace(job, tolerations=("pool=serve",))
        jobs.append(job)
    return jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_taints_and_affinity_decide_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, _, queues = synthetic()
    jobs = with_rules(seed)
    twin = Twin(jobs, racks_with_a_tainted_pool(), policy, queues)
    assert_identical(twin.run())
    placed = {r.id for r in twin.sim.records}
    assert any(j.affinity for j in jobs if j.id in placed), "no job with a rule ran: the case tests nothing"
    assert any(j.tolerations for j in jobs if j.id in placed)
