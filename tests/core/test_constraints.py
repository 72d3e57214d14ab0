"""``core.constraints``: taints and tolerations, affinity and anti-affinity between jobs, under every policy.

Every cycle also runs with the pending list reversed and must decide the same (the core's determinism).
"""

from __future__ import annotations

import msgspec
import pytest

from rallypoint.core import Decisions, Node
from rallypoint.core.types import Affinity

from .builders import cluster, cycle_both_orders, nodes, pending, running

POLICIES = ("fifo", "easy-backfill", "las", "rallypoint")
WEB_RACK = (Affinity(group="web", level="rack", anti=True),)


def _nodes_of(decisions: Decisions) -> dict[str, set[str]]:
    return {b.job_id: {p.node_id for p in b.placements} for b in decisions.binds}


def _reasons(decisions: Decisions) -> dict[str, tuple[str, str]]:
    return {p.job_id: (p.code, p.message) for p in decisions.pending}


def _tainted(ns: list[Node], node_ids: set[str], taint: str) -> list[Node]:
    return [msgspec.structs.replace(n, taints=(taint,)) if n.id in node_ids else n for n in ns]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_tainted_node_takes_only_jobs_that_tolerate_it(policy: str) -> None:
    ns = _tainted(nodes(racks=1, per_rack=2), {"s0r0n1"}, "dedicated=inference")
    model = cluster(ns)
    jobs = [
        pending("train", 8),
        pending("serve", 8, submit=1.0, tolerations=("dedicated=inference",)),
        pending("more", 8, submit=2.0),  # the untainted node is full: waits, never on the tainted one
    ]
    d = cycle_both_orders(model, jobs, policy)
    assert _nodes_of(d) == {"train": {"s0r0n0"}, "serve": {"s0r0n1"}}
    assert "more" in _reasons(d)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_bare_key_tolerates_any_value_and_a_wrong_value_does_not(policy: str) -> None:
    ns = _tainted(nodes(racks=1, per_rack=1), {"s0r0n0"}, "gpu=a100-reserved")
    model = cluster(ns)
    jobs = [
        pending("bare", 4, tolerations=("gpu",)),
        pending("wrong", 4, submit=1.0, tolerations=("gpu=other",)),
    ]
    d = cycle_both_orders(model, jobs, policy)
    assert set(_nodes_of(d)) == {"bare"}
    code, message = _reasons(d)["wrong"]
    assert code == "Resources" and "gpu=a100-reserved" in message, message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_tolerating_job_never_lands_on_an_unhealthy_tainted_node(policy: str) -> None:
    ns = _tainted(nodes(racks=1, per_rack=1), {"s0r0n0"}, "pool=serve")
    model = cluster(ns, unhealthy=("s0r0n0",))
    d = cycle_both_orders(model, [pending("serve", 1, tolerations=("pool",))], policy)
    assert not d.binds


@pytest.mark.parametrize("policy", POLICIES)
def test_replicas_with_rack_anti_affinity_spread_over_racks_in_one_cycle(policy: str) -> None:
    model = cluster(nodes(racks=3, per_rack=2))
    jobs = [pending(f"web{i}", 1, submit=float(i), affinity=WEB_RACK) for i in range(4)]
    d = cycle_both_orders(model, jobs, policy)
    racks = [next(iter(n))[:4] for n in _nodes_of(d).values()]
    assert len(racks) == 3 and len(set(racks)) == 3, racks  # three racks: the fourth replica waits
    code, message = _reasons(d)["web3"]
    assert code == "Resources" and "anti-affinity web:rack" in message, message


@pytest.mark.parametrize("policy", POLICIES)
def test_anti_affinity_counts_running_members_of_the_same_team_only(policy: str) -> None:
    model = cluster(
        nodes(racks=2, per_rack=1),
        [
            running("web0", {"s0r0n0": (0,)}, affinity_groups=("web",)),
            running("other-team", {"s0r1n0": (0,)}, team="u", affinity_groups=("web",)),
        ],
    )
    d = cycle_both_orders(model, [pending("web1", 1, affinity=WEB_RACK)], policy)
    assert _nodes_of(d) == {"web1": {"s0r1n0"}}


@pytest.mark.parametrize("policy", POLICIES)
def test_affinity_follows_a_running_member_and_goes_anywhere_without_one(policy: str) -> None:
    near = (Affinity(group="data", level="node"),)
    cache = running("cache", {"s0r1n0": (0,)}, affinity_groups=("data",))
    model = cluster(nodes(racks=2, per_rack=1), [cache])
    d = cycle_both_orders(model, [pending("reader", 2, affinity=near)], policy)
    assert _nodes_of(d) == {"reader": {"s0r1n0"}}
    alone = cycle_both_orders(
        cluster(nodes(racks=2, per_rack=1)), [pending("reader", 2, affinity=near)], policy
    )
    assert len(alone.binds) == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_larger_than_the_untainted_nodes_says_the_taints_keep_it(policy: str) -> None:
    model = cluster(_tainted(nodes(racks=1, per_rack=2), {"s0r0n1"}, "pool=serve"))
    plain = _reasons(cycle_both_orders(model, [pending("plain", 16)], policy))["plain"][1]
    assert "tainted pool=serve that it does not tolerate" in plain, plain
    tolerant = _reasons(cycle_both_orders(model, [pending("tolerant", 16, tolerations=("other",))], policy))
    assert "the nodes open to it (taints pool=serve need a toleration) have 8" in tolerant["tolerant"][1]


def _zones() -> list[Node]:
    """Two 8-GPU nodes, zone a and zone b, each with 16 cores."""
    return [
        Node(id=f"n{z}", rack="r", gpus=8, cpu_milli=16_000, memory_mib=1 << 20, labels=(("zone", z),))
        for z in "ab"
    ]


def test_a_gang_with_a_selector_preempts_lower_jobs_only_where_it_may_run() -> None:
    model = cluster(
        _zones(),
        [
            running("low-a", {"na": (0, 1, 2, 3, 4, 5, 6, 7)}, priority_class="best-effort"),
            running("low-b", {"nb": (0, 1, 2, 3)}, priority_class="best-effort"),
        ],
    )
    gang = pending("gang", 8, node_selector=(("zone", "a"),), priority_class="training-high")
    d = cycle_both_orders(model, [gang], "rallypoint")
    assert [(p.victim_id, p.for_job) for p in d.preemptions] == [("low-a", "gang")]
    assert _reasons(d)["gang"][0] == "Preempting"
    # while its victim stops it waits, asks for nobody else, and its slot is held from a lower job
    model.update_running(msgspec.structs.replace(model.running["low-a"], preempting_for="gang"))
    d = cycle_both_orders(model, [gang, pending("filler", 4, priority_class="best-effort")], "rallypoint")
    assert not d.preemptions and _reasons(d)["gang"][0] == "Preempting"
    assert all("na" not in n for n in _nodes_of(d).get("filler", set()))
    model.unbind("low-a")
    d = cycle_both_orders(model, [gang], "rallypoint")
    assert _nodes_of(d) == {"gang": {"na"}}


def test_a_gang_asking_for_cpu_evicts_the_job_that_holds_the_cpu_and_never_a_higher_one() -> None:
    model = cluster(
        _zones(),
        [
            running("cpu-hog", {"na": (0,)}, priority_class="best-effort", cpu_milli=14_000),
            running("prod", {"nb": (0,)}, priority_class="production", cpu_milli=14_000),
        ],
    )
    gang = pending("gang", 4, cpu_milli=8_000, priority_class="training-high")
    d = cycle_both_orders(model, [gang], "rallypoint")
    assert [p.victim_id for p in d.preemptions] == ["cpu-hog"]
    # ranked below both, it evicts nobody and waits naming CPU
    d = cycle_both_orders(
        model, [pending("low", 4, cpu_milli=8_000, priority_class="best-effort")], "rallypoint"
    )
    assert not d.preemptions and "CPU" in _reasons(d)["low"][1]
