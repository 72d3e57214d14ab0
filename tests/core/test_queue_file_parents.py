"""The queue file's hierarchy (org > org > team): how it is read, checked, and enforced by the core.

Cases as data; the core runs on real snapshots (tests/core/builders), the same translation the scheduler
service and the simulator use.
"""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.core import schedule
from rallypoint.core.policies import policy_by_name
from rallypoint.core.quota import QuotaBook
from rallypoint.core.types import Snapshot
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import QueuesError, queues_from_obj
from rallypoint.sim.engine import to_core_queues

from .builders import ALL, cluster, nodes, pending, running

# research (limit 24) > language (limit 16) > nlp, speech; vision directly under research. One cohort:
# idle nominal is lendable to every team, so only the orgs' limits stop nlp.
HIERARCHY: dict[str, Any] = {
    "cohorts": [{"name": "lab"}],
    "orgs": [
        {"name": "research", "limit": 24},
        {"name": "language", "parent": "research", "limit": 16},
    ],
    "teams": [
        {"name": "nlp", "parent": "language", "cohort": "lab", "nominal": 8},
        {"name": "speech", "parent": "language", "cohort": "lab", "nominal": 8},
        {"name": "vision", "parent": "research", "cohort": "lab", "nominal": 8},
        {"name": "infra", "cohort": "lab", "nominal": 16},
    ],
}


def test_parents_are_read_into_core_queues_with_org_limits() -> None:
    queues, _ = core_queues(queues_from_obj(HIERARCHY))
    by_name = {q.name: q for q in queues}
    assert by_name["nlp"].parent == "language" and by_name["language"].parent == "research"
    assert by_name["research"].parent is None
    assert [(q.nominal, q.borrowing_limit) for q in by_name["language"].quotas] == [(16, None)]
    assert by_name["nlp"].cohort == "lab"


def test_lineage_walks_every_org_above_a_team() -> None:
    q = queues_from_obj(HIERARCHY)
    assert q.lineage("nlp") == ["language", "research"]
    assert q.lineage("infra") == []
    assert q.lineage("unknown") == []


def test_simulator_and_scheduler_translate_the_file_identically() -> None:
    q = queues_from_obj(HIERARCHY)
    assert to_core_queues(q) == core_queues(q)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"orgs": [{"name": "a"}, {"name": "a"}]}, "duplicate org name"),
        ({"orgs": [{"name": "nlp"}], "teams": [{"name": "nlp"}]}, "'nlp' is both an org and a team"),
        ({"teams": [{"name": "nlp", "parent": "nowhere"}]}, "team nlp: parent 'nowhere' is not an org"),
        ({"teams": [{"name": "x"}, {"name": "nlp", "parent": "x"}]}, "parent 'x' is not an org"),
        (
            {"orgs": [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}]},
            "org a: its parents form a cycle",
        ),
        ({"orgs": [{"name": "a", "limit": -1}]}, "org a: limit must be >= 0"),
        ({"orgs": [{"name": "a", "size": 3}]}, "unknown field"),
    ],
)
def test_malformed_hierarchies_are_refused_naming_the_problem(change: dict[str, Any], says: str) -> None:
    with pytest.raises(QueuesError, match=says):
        queues_from_obj(change, "q.yaml")


def _decide(running_jobs: list[Any], waiting: list[Any]) -> dict[str, tuple[str, str]]:
    """Each job's outcome: ("bound", ""), (pending code, message) or ("preempted", "<reason> for <job>")."""
    queues, classes = core_queues(queues_from_obj(HIERARCHY))
    snap = Snapshot(
        now=100.0,
        cluster=cluster(nodes(racks=1, per_rack=6), running_jobs),
        pending=tuple(waiting),
        queues=queues,
        priority_classes=classes,
    )
    decisions = schedule(snap, policy_by_name("rallypoint"))
    out = {b.job_id: ("bound", "") for b in decisions.binds}
    out.update({p.job_id: (p.code, p.message) for p in decisions.pending})
    out.update({p.victim_id: ("preempted", f"{p.reason} for {p.for_job}") for p in decisions.preemptions})
    return out


def test_the_nearest_org_limit_stops_a_team_that_could_still_borrow() -> None:
    # nlp holds 16 (8 nominal + 8 borrowed); the cohort still has idle nominal and the cluster free GPUs,
    # but language's limit of 16 is reached
    held = [running("n1", {"s0r0n0": ALL, "s0r0n1": ALL}, team="nlp")]
    out = _decide(held, [pending("n2", 8, team="nlp", submit=1.0)])
    assert out["n2"] == ("QuotaExceeded", "org language uses 16 of 16 h100 GPUs; needs 8 more; 0 jobs ahead")


def test_a_sibling_within_nominal_reclaims_what_its_org_lent_a_borrower() -> None:
    # speech is within its own nominal, but language (nlp + speech) is at its limit because nlp borrows:
    # speech's guaranteed share is reclaimed from nlp rather than bound past the org's limit
    held = [running("n1", {"s0r0n0": ALL, "s0r0n1": ALL}, team="nlp")]
    out = _decide(held, [pending("s1", 8, team="speech", submit=1.0)])
    assert out["s1"][0] == "Preempting"
    assert out["n1"] == ("preempted", "reclaim for s1")


def test_the_grandparent_limit_counts_every_team_below_it() -> None:
    # language holds 8 (well under 16), vision 16: research (24) is full, so nlp waits on research
    held = [
        running("n1", {"s0r0n0": ALL}, team="nlp"),
        running("v1", {"s0r0n1": ALL, "s0r0n2": ALL}, team="vision"),
    ]
    out = _decide(held, [pending("n2", 8, team="nlp", submit=1.0)])
    assert out["n2"] == ("QuotaExceeded", "org research uses 24 of 24 h100 GPUs; needs 8 more; 0 jobs ahead")


def test_below_every_limit_a_team_borrows_idle_cohort_quota() -> None:
    held = [running("n1", {"s0r0n0": ALL}, team="nlp")]
    out = _decide(held, [pending("n2", 8, team="nlp", submit=1.0)])
    assert out["n2"] == ("bound", "")


def test_an_org_is_not_a_cohort_member_lending_its_limit() -> None:
    # infra (16 nominal, holding 24) may borrow only the teams' idle nominal (nlp 8 + speech 8 + vision 8 =
    # 24), never the orgs' limits on top
    held = [running("i0", {"s0r0n0": ALL, "s0r0n1": ALL, "s0r0n2": ALL}, team="infra")]
    out = _decide(held, [pending("i1", 24, team="infra", submit=1.0)])
    assert out["i1"] == (
        "QuotaExceeded",
        "queue infra uses 24 of 16 nominal h100 GPUs; needs 24; cohort can lend 24; 0 jobs ahead",
    )


def test_a_job_larger_than_an_org_limit_is_told_it_never_fits() -> None:
    # nlp could borrow up to 8 + 32 idle nominal, but language holds at most 16: 24 GPUs never fit. It waits
    # (as Kueue's inadmissible workloads do: the queue file may change), and its reason says so
    out = _decide([], [pending("n1", 24, team="nlp")])
    assert out["n1"] == (
        "QuotaExceeded",
        "org language uses 0 of 16 h100 GPUs; needs 24 more; never fits its quota: queue nlp holds at most "
        "16 h100 GPUs (org language's limit); 0 jobs ahead",
    )


def test_a_job_larger_than_nominal_plus_all_lendable_quota_is_told_it_never_fits() -> None:
    # infra: nominal 16 + the teams' 24 idle nominal = 40 at most, on a cluster of 48 GPUs
    out = _decide([], [pending("i1", 48, team="infra")])
    assert out["i1"] == (
        "QuotaExceeded",
        "queue infra uses 0 of 16 nominal h100 GPUs; needs 48; cohort can lend 24; never fits its quota: "
        "queue infra holds at most 40 h100 GPUs (nominal 16 + 24 its cohort could lend); 0 jobs ahead",
    )


def test_a_job_within_its_ceiling_is_not_told_it_never_fits() -> None:
    held = [running("v1", {"s0r0n0": ALL, "s0r0n1": ALL}, team="vision")]
    # 16 for nlp fits language's 16 but not research's 24 while vision holds 16: it waits for vision
    out = _decide(held, [pending("n2", 16, team="nlp", submit=1.0)])
    assert out["n2"] == ("QuotaExceeded", "org research uses 16 of 24 h100 GPUs; needs 16 more; 0 jobs ahead")


def test_the_ceiling_names_what_sets_it() -> None:
    config = queues_from_obj(
        {
            "cohorts": [{"name": "lab"}],
            "orgs": [{"name": "org", "limit": 10}],
            "teams": [
                {"name": "capped", "cohort": "lab", "nominal": 4, "borrowing_limit": 2},
                {"name": "free", "cohort": "lab", "nominal": 4},
                {"name": "held", "cohort": "lab", "nominal": 4, "lending_limit": 1, "parent": "org"},
            ],
        }
    )
    book = QuotaBook(core_queues(config)[0])
    # in thousandths of a GPU, as GPU quota counts (``core.units``); the words in GPUs
    assert book.ceiling("capped", "h100") == (6_000, "nominal 4 + borrowing limit 2")
    assert book.ceiling("free", "h100") == (9_000, "nominal 4 + 5 its cohort could lend")  # 4 + held's 1
    assert book.ceiling("held", "h100") == (10_000, "org org's limit")  # 4 + 8 lendable, capped at 10
    assert book.ceiling("unknown", "h100") is None
