"""The twin (``tests/sim/test_twin.py``) for fair share between the users of a team (issue 35 item 7): the
users' usage is folded the same way in the simulator and live (``userusage``), so they order the same."""

from __future__ import annotations

import random

import msgspec
import pytest
from test_twin import POLICIES, J, assert_identical, seeded, synthetic

from rallypoint.scheduling.queues import queues_from_obj
from rallypoint.sim.cluster import cluster_from_obj
from rallypoint.sim.twin import Twin, run_twin
from rallypoint.sim.workload import Job

USERS = ("alice", "bob", "carol")


def with_users(seed: int) -> list[Job]:
    rng = random.Random(seed)
    return [msgspec.structs.replace(job, user=rng.choice(USERS)) for job in seeded(seed)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_users_usage_decides_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, _ = synthetic()
    # the synthetic teams, with users weighted in one of them
    queues = queues_from_obj(
        {
            "cohorts": [{"name": "all"}],
            "teams": [
                {"name": "t1", "nominal": 16, "cohort": "all", "borrowing_limit": 8, "users": {"alice": 3}},
                {"name": "t2", "nominal": 16, "cohort": "all"},
            ],
        }
    )
    twin = Twin(with_users(seed), cluster, policy, queues)
    assert_identical(twin.run())
    # the core was given usage rows: the comparison covered them
    assert any(twin.live.state.users.get(t) for t in ("t1", "t2"))


def one_heavy_user() -> list[Job]:
    """Alice holds the whole cluster, then both users wait for it: alice first, bob after her."""
    return [
        J("alice-big", 0.0, 16, 1000.0, "t", user="alice"),
        J("alice-next", 10.0, 16, 100.0, "t", user="alice"),
        J("bob-first", 20.0, 16, 100.0, "t", user="bob"),
    ]


@pytest.mark.parametrize("policy", ["rallypoint", "fifo"])
def test_the_light_user_goes_first_in_both_worlds(policy: str) -> None:
    cluster = cluster_from_obj({"generator": {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 8}})
    twin = Twin(one_heavy_user(), cluster, policy)
    assert_identical(twin.run())
    start = {r.id: r.start for r in twin.sim.records}
    if policy == "rallypoint":  # fair share: bob, who has used nothing, before alice's second job
        assert start["bob-first"] < start["alice-next"]
    else:  # strict submission order knows no users
        assert start["alice-next"] < start["bob-first"]


def test_without_users_nothing_changes() -> None:
    _, cluster, queues = synthetic()
    report = run_twin(seeded(0), cluster, "rallypoint", queues)
    assert_identical(report)
    assert all(j.user is None for j in seeded(0))
