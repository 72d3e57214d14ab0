"""Fractional jobs sized by GPU memory (``PendingJob.gpu_memory_mib``, ``core.sharing.need_on``): the share
a job holds on a GPU is the larger of its ``gpu_milli`` and its memory's part of that GPU's, recorded in
its Bind (``TaskPlacement.milli``), under every policy and in either pending order."""

from __future__ import annotations

import pytest

from rallypoint.core import (
    ClusterModel,
    Decisions,
    Node,
    PendingJob,
    RunningJob,
)

from .builders import cycle_both_orders, pending

POLICIES = ("fifo", "easy-backfill", "las", "rallypoint")
GIB = 1024


def _node(node_id: str, gpu_gib: int, gpus: int = 1) -> Node:
    return Node(id=node_id, rack="r0", gpus=gpus, gpu_type="h", gpu_memory_mib=gpu_gib * GIB)


def _share(job_id: str, submit: float, gib: int, milli: int = 0) -> PendingJob:
    return pending(job_id, 1, submit=submit, gpu_milli=milli, gpu_memory_mib=gib * GIB)


def _bind(model: ClusterModel, decisions: Decisions) -> None:
    for b in decisions.binds:
        milli = b.placements[0].milli
        model.bind(
            RunningJob(
                id=b.job_id, team="t", gpus=1, placements=b.placements, start_time=100.0, gpu_milli=milli
            )
        )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_memory_share_is_its_part_of_the_gpus_memory_and_the_bind_says_so(policy: str) -> None:
    model = ClusterModel([_node("a", 80)])
    d = cycle_both_orders(
        model, [_share("q1", 0.0, 20), _share("q2", 1.0, 40), _share("q3", 2.0, 30)], policy
    )
    got = {b.job_id: b.placements[0].milli for b in d.binds}
    assert got == {"q1": 250, "q2": 500}  # 20 and 40 of 80 GiB; 30 more GiB do not fit beside them
    _bind(model, d)
    assert model.shares == {("a", 0): 750}


@pytest.mark.parametrize("policy", POLICIES)
def test_the_larger_of_the_fraction_and_the_memory_counts_and_smaller_gpus_give_larger_shares(
    policy: str,
) -> None:
    model = ClusterModel([_node("big", 80), _node("small", 40)])
    d = cycle_both_orders(model, [_share("mixed", 0.0, 10, milli=600)], policy)
    assert d.binds[0].placements[0].milli == 600  # 10 GiB is 125 of 80 GiB or 250 of 40: the 600 wins
    small = ClusterModel([_node("small", 40)])
    d = cycle_both_orders(small, [_share("mem", 0.0, 30)], policy)
    assert d.binds[0].placements[0].milli == 750


@pytest.mark.parametrize("policy", POLICIES)
def test_more_memory_than_any_gpu_has_waits_naming_it(policy: str) -> None:
    model = ClusterModel([_node("a", 40), Node(id="unknown", rack="r0", gpus=1, gpu_type="h")])
    d = cycle_both_orders(model, [_share("huge", 0.0, 60)], policy)
    assert not d.binds
    (reason,) = d.pending
    assert reason.code == "Resources" and "61440 MiB of a GPU's memory" in reason.message, reason
