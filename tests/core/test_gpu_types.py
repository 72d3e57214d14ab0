"""``PendingJob.gpu_types``: a job that allows several GPU types, in its order of preference.

Table cases in the style of ``test_table``: ``policy`` (one name or a tuple of names, each run), ``cluster``,
``pending``, optional ``now``; expectations ``binds`` {job: set of nodes}, ``waits`` {job: code}, ``says``
{job: substring of the message}, ``preempts`` {victim: reason}, ``reserved`` {job: (start, set of nodes)}.
Every case is also run with the pending list reversed and must give byte-identical decisions.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from rallypoint.core import Decisions, Node, Snapshot, policy_by_name, schedule

from .builders import ALL, cluster, nodes, pending, running

POLICIES = ("fifo", "easy-backfill", "las", "rallypoint")
# two nodes of 8 GPUs per type: as0r0n0, as0r0n1 (type A), bs0r0n0, bs0r0n1 (B), cs0r0n0, cs0r0n1 (C)
A = nodes(gpu_type="A", prefix="a")
B = nodes(gpu_type="B", prefix="b")
C = nodes(gpu_type="C", prefix="c")


def two(prefix: str) -> dict[str, tuple[int, ...]]:
    """Every GPU of both nodes of one type."""
    return {f"{prefix}s0r0n0": ALL, f"{prefix}s0r0n1": ALL}


def most(prefix: str) -> dict[str, tuple[int, ...]]:
    """GPUs 0-6 of both nodes of one type (a reservation there holds GPU 7 of each, naming the nodes)."""
    return {f"{prefix}s0r0n0": ALL[:7], f"{prefix}s0r0n1": ALL[:7]}


def ab(*ns: list[Node]) -> list[Node]:
    return [n for group in ns for n in group]


CASES: list[dict[str, Any]] = [
    dict(
        id="binds-on-the-first-allowed-type-with-room",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_types=("B", "A"))],
        binds={"j": {"bs0r0n0"}},
    ),
    dict(
        id="first-type-order-is-the-jobs-not-the-clusters",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_types=("A", "B"))],
        binds={"j": {"as0r0n0"}},
    ),
    dict(
        id="falls-through-to-the-second-type-when-the-first-is-full",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B), [running("rb", two("b"))]),
        pending=[pending("j", 16, 8, gpu_types=("B", "A"))],
        binds={"j": {"as0r0n0", "as0r0n1"}},
    ),
    dict(
        id="fills-the-first-type-then-the-second-then-waits",
        policy=("easy-backfill", "rallypoint"),
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending(f"j{i}", 8, submit=i, gpu_types=("B", "A")) for i in range(5)],
        binds={"j0": {"bs0r0n0"}, "j1": {"bs0r0n1"}, "j2": {"as0r0n0"}, "j3": {"as0r0n1"}},
        waits={"j4": "Resources"},
        says={"j4": "needs 8 B|A GPUs"},
    ),
    dict(
        id="never-binds-on-a-type-it-does-not-list",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B, C), [running("ra", two("a")), running("rb", two("b"))]),
        pending=[pending("j", 8, gpu_types=("A", "B"))],
        waits={"j": "Resources"},
        says={"j": "needs 8 A|B GPUs"},
    ),
    dict(
        id="message-counts-free-gpus-of-the-listed-types-only",
        policy=("easy-backfill",),
        cluster=lambda: cluster(
            ab(A, B, C), [running("ra", two("a")), running("rb", {"bs0r0n0": ALL, "bs0r0n1": (0, 1)})]
        ),
        pending=[pending("j", 16, 8, gpu_types=("A", "B"))],
        waits={"j": "Resources"},
        says={"j": "needs 16 A|B GPUs in the cluster; 6 free"},
    ),
    dict(
        id="a-listed-type-the-cluster-lacks-is-ignored",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_types=("Z", "B"))],
        binds={"j": {"bs0r0n0"}},
    ),
    dict(
        id="only-absent-types-can-never-fit",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_types=("Y", "Z"))],
        waits={"j": "GangTooLarge"},
        says={"j": "no node has GPU type Y|Z"},
    ),
    dict(
        id="capacity-is-the-best-listed-type",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, nodes(racks=1, per_rack=4, gpu_type="B", prefix="b"))),
        pending=[pending("j", 24, 8, gpu_types=("A", "C"))],
        waits={"j": "GangTooLarge"},
        says={"j": "needs 24 A|C GPUs in the cluster; largest cluster has 16"},
    ),
    dict(
        id="both-gpu-type-and-gpu-types-is-invalid",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_type="A", gpu_types=("A", "B")), pending("k", 8, submit=1)],
        waits={"j": "Invalid"},
        says={"j": "names both gpu_type A and gpu_types A|B"},
    ),
    dict(
        id="empty-gpu-types-is-invalid",
        policy=("rallypoint",),
        cluster=lambda: cluster(ab(A, B)),
        pending=[pending("j", 8, gpu_types=())],
        waits={"j": "Invalid"},
    ),
    dict(
        id="single-listed-type-behaves-like-gpu-type",
        policy=POLICIES,
        cluster=lambda: cluster(ab(A, B), [running("ra", {"as0r0n0": (0, 1, 2, 3)})]),
        pending=[pending("j", 4, gpu_types=("A",))],
        binds={"j": {"as0r0n0"}},
    ),
    # --- reservations ---------------------------------------------------------------------------
    dict(
        id="reservation-only-on-listed-types",
        policy=("easy-backfill",),
        cluster=lambda: cluster(
            ab(A, B, C),
            [
                running("ra", most("a"), expected_end=1000.0),
                running("rb", most("b"), expected_end=500.0),
                running("rc", most("c"), expected_end=200.0),
            ],
        ),
        pending=[pending("j", 16, 8, gpu_types=("A", "B"))],
        waits={"j": "Resources"},
        reserved={"j": (500.0, {"bs0r0n0", "bs0r0n1"})},
    ),
    dict(
        id="reservation-ties-go-to-the-first-listed-type",
        policy=("easy-backfill", "rallypoint"),
        cluster=lambda: cluster(
            ab(A, B),
            [running("ra", most("a"), expected_end=500.0), running("rb", most("b"), expected_end=500.0)],
        ),
        pending=[pending("j", 16, 8, gpu_types=("B", "A"))],
        reserved={"j": (500.0, {"bs0r0n0", "bs0r0n1"})},
    ),
    dict(
        id="reservation-never-on-an-unlisted-type",
        policy=("easy-backfill",),
        cluster=lambda: cluster(
            ab(A, B), [running("ra", two("a"), expected_end=None), running("rb", two("b"), expected_end=50.0)]
        ),
        pending=[pending("j", 16, 8, gpu_types=("A", "Z"))],
        waits={"j": "Resources"},
        reserved={},
    ),
    # --- preemption -----------------------------------------------------------------------------
    dict(
        id="las-preempts-on-the-first-listed-type",
        policy=("las",),
        now=1000.0,
        cluster=lambda: cluster(
            ab(A, B, C),
            [
                running("ha", two("a"), start_time=0.0),
                running("hb", two("b"), start_time=0.0),
                running("hc", two("c"), start_time=0.0),
            ],
        ),
        pending=[pending("fresh", 8, submit=900.0, gpu_types=("C", "B"))],
        preempts={"hc": "las"},
    ),
    dict(
        id="priority-preemption-skips-unlisted-and-full-types",
        policy=("rallypoint",),
        now=1000.0,
        cluster=lambda: cluster(
            ab(A, B, C),
            [
                running("pa", two("a"), priority_class="best-effort"),
                running("pb", two("b"), priority_class="production", preemptible=False),
                running("pc", two("c"), priority_class="best-effort"),
            ],
        ),
        pending=[pending("prod", 8, priority_class="production", gpu_types=("B", "C"))],
        preempts={"pc": "priority"},
        waits={"prod": "Preempting"},
    ),
    dict(
        id="victims-still-stopping-hold-their-gpus-for-the-preemptor",
        policy=("rallypoint",),
        now=1000.0,
        cluster=lambda: cluster(
            ab(A, B, C),
            [
                running("pb", two("b"), priority_class="production", preemptible=False),
                running("pc", {"cs0r0n0": ALL}, priority_class="best-effort", preempting_for="prod"),
                running("pc2", {"cs0r0n1": ALL}, priority_class="production", preemptible=False),
            ],
        ),
        pending=[pending("prod", 8, priority_class="production", gpu_types=("B", "C"))],
        preempts={},
        waits={"prod": "Preempting"},
        says={"prod": "waiting for 1 preempted job to stop (pc)"},
        reserved={"prod": (None, {"cs0r0n0"})},
    ),
]


def _cases() -> list[Any]:
    return [pytest.param(c, p, id=f"{c['id']}[{p}]") for c in CASES for p in c["policy"]]


def _run(case: dict[str, Any], policy: str, reverse: bool = False) -> Decisions:
    pend = tuple(case["pending"])
    snap = Snapshot(
        now=case.get("now", 100.0), cluster=case["cluster"](), pending=pend[::-1] if reverse else pend
    )
    return schedule(snap, policy_by_name(policy))


@pytest.mark.parametrize(("case", "policy"), _cases())
def test_gpu_types(case: dict[str, Any], policy: str) -> None:
    d = _run(case, policy)
    binds = {b.job_id: b for b in d.binds}
    waits = {r.job_id: r for r in d.pending}
    assert set(binds) | set(waits) == {j.id for j in case["pending"]}
    assert not set(binds) & set(waits)
    if "binds" in case:
        got = {jid: b for jid, b in binds.items() if jid in case["binds"]}
        assert set(got) == set(case["binds"]), (d.binds, d.pending)
        for jid, want in case["binds"].items():
            assert {p.node_id for p in got[jid].placements} == want, got[jid]
    for jid, code in case.get("waits", {}).items():
        assert jid in waits, f"{jid} was bound"
        assert waits[jid].code == code, waits[jid]
    for jid, text in case.get("says", {}).items():
        assert text in waits[jid].message, waits[jid].message
    if "preempts" in case:
        assert {p.victim_id: p.reason for p in d.preemptions} == case["preempts"], d
    if "reserved" in case:
        got_r = {r.job_id: (r.start_estimate, set(r.nodes)) for r in d.reservations}
        assert got_r == case["reserved"], d
    # deterministic: the same input again, and the pending list reversed, give byte-identical output
    assert msgspec.json.encode(_run(case, policy)) == msgspec.json.encode(d)
    assert msgspec.json.encode(_run(case, policy, reverse=True)) == msgspec.json.encode(d)


def test_bound_type_is_always_listed() -> None:
    """Many jobs with different lists on a three-type cluster: every bind lands on a listed type, and a
    job whose first listed type still had room when it was placed got that type."""
    import random

    rng = random.Random(11)
    ns = ab(
        nodes(racks=2, per_rack=3, gpu_type="A", prefix="a"),
        nodes(racks=2, per_rack=3, gpu_type="B", prefix="b"),
        nodes(racks=2, per_rack=3, gpu_type="C", prefix="c"),
    )
    type_of = {n.id: n.gpu_type for n in ns}
    lists = [("A", "B"), ("B", "A"), ("C",), ("C", "A", "B"), ("B", "Z")]
    pend = [
        pending(f"j{i}", g, min(g, 8), submit=float(i), gpu_types=rng.choice(lists))
        for i, g in enumerate(rng.choice((1, 2, 4, 8, 16)) for _ in range(60))
    ]
    for pol in POLICIES:
        d = schedule(Snapshot(now=0.0, cluster=cluster(ns), pending=tuple(pend)), policy_by_name(pol))
        want = {j.id: j.gpu_types for j in pend}
        assert d.binds
        for b in d.binds:
            types = {type_of[p.node_id] for p in b.placements}
            assert len(types) == 1 and types <= set(want[b.job_id] or ()), (b, want[b.job_id])
        rev = schedule(Snapshot(now=0.0, cluster=cluster(ns), pending=tuple(pend[::-1])), policy_by_name(pol))
        assert msgspec.json.encode(rev) == msgspec.json.encode(d)
