"""The twin (``tests/sim/test_twin.py``) for fractional jobs sized by GPU memory: on nodes of two GPU
memory sizes, notebooks asking for GPU memory (some with a fraction too) and whole-GPU gangs decide byte for
byte the same in the simulator and through the live fold and bridge; the share each got is in its Bind."""

from __future__ import annotations

import random

import pytest
from gpujoins import GpuJoins
from test_twin import POLICIES, J, assert_identical, synthetic

from rallypoint.sim.cluster import Cluster, cluster_from_obj
from rallypoint.sim.twin import Twin
from rallypoint.sim.workload import Job


def two_memory_sizes() -> Cluster:
    """Two nodes of 80 GiB GPUs, two of 40 GiB GPUs, one type."""
    return cluster_from_obj(
        {
            "nodes": [
                {"id": f"n{i}", "rack": f"r{i // 2}", "gpus": 4, "gpu_memory": 81920 if i < 2 else 40960}
                for i in range(4)
            ]
        }
    )


def with_memory_shares(seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs: list[Job] = []
    for i in range(40):
        submit, duration = float(rng.randrange(0, 200)), float(rng.randrange(20, 200))
        if rng.random() < 0.7:
            share: dict[str, object] = {"gpu_memory_mib": rng.choice((8192, 20480, 30720, 61440))}
            if rng.random() < 0.3:
                share["gpu_milli"] = rng.choice((200, 500))
            jobs.append(J(f"nb{i}", submit, 1, duration, rng.choice(("t1", "t2")), **share))
        else:
            jobs.append(J(f"w{i}", submit, rng.choice((1, 2, 4)), duration, "t2", time_limit=400.0))
    return sorted(jobs, key=lambda j: j.submit)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_memory_shares_decide_the_same_in_the_simulator_and_live(
    policy: str, seed: int, gpu_joins: GpuJoins
) -> None:
    _, _, queues = synthetic()
    twin = Twin(with_memory_shares(seed), two_memory_sizes(), policy, queues)
    assert_identical(twin.run())
    assert gpu_joins.shares, "no memory share ever joined another on a GPU: the case tests nothing"
