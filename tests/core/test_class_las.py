"""Table-driven tests of rallypoint's class + LAS order and its churn guards (``class_las``)."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.core import Queue, Quota, Snapshot, policy_by_name, schedule

from .builders import ALL, cluster, nodes, pending, running

N2 = nodes(racks=1, per_rack=2)  # s0r0n0, s0r0n1: 16 GPUs
N3 = nodes(racks=1, per_rack=3)  # s0r0n0 .. s0r0n2: 24 GPUs
COHORT = [
    Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
    Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
]

CASES: list[dict[str, Any]] = [
    dict(
        id="least-attained-service-first-inside-a-class",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[pending("served", 8, submit=1, attained_gpu_s=5000.0), pending("fresh", 8, submit=2)],
        binds={"fresh"},
        waits={"served": "Resources"},
    ),
    dict(
        id="strict-class-first-whatever-its-attained-service",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("fresh-std", 8, submit=1),
            pending("served-high", 8, submit=2, attained_gpu_s=50000.0, priority_class="training-high"),
        ],
        binds={"served-high"},
        waits={"fresh-std": "Resources"},
    ),
    dict(
        id="every-class-strict-when-strict-class-min-is-none",
        overrides={"strict_class_min": None},
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("fresh-be", 8, submit=1, priority_class="best-effort"),
            pending("served-std", 8, submit=2, attained_gpu_s=50000.0),
        ],
        binds={"served-std"},
        waits={"fresh-be": "Resources"},
    ),
    dict(
        id="below-the-strict-classes-less-work-left-goes-first",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("fresh-be", 8, submit=2, priority_class="best-effort"),
            pending("served-std", 8, submit=1, attained_gpu_s=50000.0),
        ],
        binds={"fresh-be"},
        waits={"served-std": "Resources"},
    ),
    dict(
        id="below-the-strict-classes-the-class-breaks-a-tie-of-levels",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("be", 8, submit=1, priority_class="best-effort"),
            pending("std", 8, submit=2),
        ],
        binds={"std"},
        waits={"be": "Resources"},
    ),
    dict(
        id="a-lower-class-never-evicts-a-higher-one-even-with-less-work-left",
        now=50000.0,
        cluster=cluster(N2, [running("std-hog", {"s0r0n0": ALL, "s0r0n1": ALL})]),
        pending=[pending("fresh-be", 8, submit=49990.0, priority_class="best-effort")],
        waits={"fresh-be": "Resources"},
        preempts={},
    ),
    dict(
        id="a-higher-class-evicts-a-lower-one-that-has-more-work-left",
        now=50000.0,
        cluster=cluster(
            N2, [running("be-hog", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort")]
        ),
        pending=[pending("fresh-std", 8, submit=49990.0)],
        waits={"fresh-std": "Preempting"},
        preempts={"be-hog": "priority"},
    ),
    dict(
        id="a-higher-class-does-not-evict-a-lower-one-with-less-work-left",
        now=50000.0,
        cluster=cluster(
            N2,
            [
                running(
                    "be-short",
                    {"s0r0n0": ALL, "s0r0n1": ALL},
                    priority_class="best-effort",
                    start_time=49000.0,
                )
            ],
        ),
        pending=[pending("served-std", 8, submit=100.0, attained_gpu_s=900000.0)],
        waits={"served-std": "Resources"},
        preempts={},
    ),
    dict(
        id="guaranteed-quota-before-borrowing-even-of-a-higher-class",
        cluster=cluster(N2, [running("b0", {"s0r0n0": ALL}, team="b")]),
        queues=COHORT,
        pending=[
            pending("b-high", 8, submit=1, team="b", priority_class="training-high"),
            pending("a-low", 8, submit=2, team="a", priority_class="best-effort"),
        ],
        binds={"a-low"},
    ),
    dict(
        id="level-aging-moves-a-long-waiting-job-up-inside-its-class",
        overrides={"level_aging_s": 3600.0, "level_by_estimate": False},
        now=2 * 3600.0 + 10,
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("old", 8, submit=0, attained_gpu_s=5000.0),
            pending("fresh", 8, submit=2 * 3600.0),
        ],
        binds={"old"},
    ),
    dict(
        id="no-preemption-when-the-job-fits-in-free-gpus",
        now=5000.0,
        cluster=cluster(N2, [running("hog", {"s0r0n0": ALL}, priority_class="best-effort")]),
        pending=[pending("high", 8, priority_class="training-high")],
        binds={"high"},
        preempts={},
    ),
    dict(
        id="recently-started-job-is-no-las-victim",
        now=5000.0,
        cluster=cluster(
            N2, [running("new", {"s0r0n0": ALL, "s0r0n1": ALL}, start_time=4900.0, attained_gpu_s=1e6)]
        ),
        pending=[pending("fresh", 8, submit=4990.0)],
        waits={"fresh": "Resources"},
        preempts={},
    ),
    dict(
        id="recently-started-lower-class-job-is-still-a-priority-victim",
        now=5000.0,
        cluster=cluster(
            N2,
            [running("new", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort", start_time=4900.0)],
        ),
        pending=[pending("high", 8, priority_class="training-high")],
        waits={"high": "Preempting"},
        preempts={"new": "priority"},
    ),
    dict(
        id="recently-restarted-victim-is-protected-too",
        now=5000.0,
        cluster=cluster(
            N2,
            [
                running(
                    "v",
                    {"s0r0n0": ALL, "s0r0n1": ALL},
                    priority_class="best-effort",
                    start_time=100.0,
                    last_preempted_at=4800.0,
                )
            ],
        ),
        pending=[pending("high", 8, priority_class="training-high")],
        waits={"high": "Resources"},
        preempts={},
    ),
    dict(
        id="lower-class-victim-after-protection",
        now=5000.0,
        cluster=cluster(N2, [running("old", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort")]),
        pending=[pending("high", 8, priority_class="training-high")],
        waits={"high": "Preempting"},
        preempts={"old": "priority"},
    ),
    dict(
        id="las-preempts-a-long-running-job-of-the-same-team-and-class",
        now=5000.0,
        cluster=cluster(N2, [running("hog", {"s0r0n0": ALL, "s0r0n1": ALL})]),
        pending=[pending("fresh", 8, submit=4990.0)],
        waits={"fresh": "Preempting"},
        preempts={"hog": "las"},
    ),
    dict(
        id="las-never-preempts-another-team-within-its-nominal",
        now=5000.0,
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=16),)),
        ],
        cluster=cluster(N2, [running("hog", {"s0r0n0": ALL, "s0r0n1": ALL}, team="b")]),
        pending=[pending("fresh", 8, submit=4990.0, team="a")],
        # a within nominal: no reclaim either, b does not borrow
        waits={"fresh": "Resources"},
        preempts={},
    ),
    dict(
        id="las-preempts-a-borrower-of-another-team-that-stays-at-nominal",
        now=5000.0,
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=0),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="c", cohort="org", quotas=(Quota(nominal=16),)),
        ],
        cluster=cluster(
            N2, [running("b1", {"s0r0n0": ALL}, team="b"), running("b2", {"s0r0n1": ALL}, team="b")]
        ),
        pending=[pending("fresh", 8, submit=4990.0, team="c", priority_class="training-standard")],
        # c is within nominal: b's borrowed GPUs come back (reclaim), exactly one job's worth
        waits={"fresh": "Preempting"},
        preempts={"b1": "reclaim"},
    ),
    dict(
        # b borrows 16 GPUs: both borrowed jobs come back for a's 2-node gang (counting a victim twice in
        # the stop rule once stopped the walk after the first, leaving a below its nominal)
        id="reclaim-takes-back-every-borrowed-gpu-the-gang-needs",
        now=5000.0,
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=16),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
        ],
        cluster=cluster(
            N3,
            [
                running("b0", {"s0r0n0": ALL}, team="b", start_time=100.0),
                running("b1", {"s0r0n1": ALL}, team="b", start_time=200.0),
                running("b2", {"s0r0n2": ALL}, team="b", start_time=300.0),
            ],
        ),
        pending=[pending("a-gang", 16, gpt=8, submit=4990.0, team="a")],
        waits={"a-gang": "Preempting"},
        preempts={"b0": "reclaim", "b1": "reclaim"},  # the most attained service first
    ),
    dict(
        id="reclaim-ignores-start-protection",
        now=5000.0,
        queues=COHORT,
        cluster=cluster(N2, [running("bjob", {"s0r0n0": ALL, "s0r0n1": ALL}, team="b", start_time=4990.0)]),
        pending=[pending("aj", 8, team="a", priority_class="best-effort")],
        waits={"aj": "Preempting"},
        preempts={"bjob": "reclaim"},
    ),
    dict(
        id="quota-blocked-job-preempts-its-own-queues-served-job-by-default",
        now=5000.0,
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=4),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=12),)),
        ],
        cluster=cluster(
            N2, [running("a-hog", {"s0r0n0": ALL}, team="a"), running("b1", {"s0r0n1": ALL}, team="b")]
        ),
        pending=[pending("a-fresh", 8, submit=4990.0, team="a")],
        waits={"a-fresh": "Preempting"},
        preempts={"a-hog": "las"},
    ),
    dict(
        id="quota-blocked-job-waits-with-preempt-for-quota-off",
        overrides={"preempt_for_quota": False},
        now=5000.0,
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=4),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=12),)),
        ],
        cluster=cluster(
            N2, [running("a-hog", {"s0r0n0": ALL}, team="a"), running("b1", {"s0r0n1": ALL}, team="b")]
        ),
        pending=[pending("a-fresh", 8, submit=4990.0, team="a")],
        waits={"a-fresh": "Resources"},  # 0 GPUs free binds first; the quota is named after them
        preempts={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_class_las(case: dict[str, Any]) -> None:
    policy = policy_by_name("rallypoint", case.get("overrides", {}))
    snap = Snapshot(
        now=case.get("now", 100.0),
        cluster=case["cluster"],
        pending=tuple(case["pending"]),
        queues=tuple(case.get("queues", ())),
    )
    d = schedule(snap, policy)
    binds = {b.job_id for b in d.binds}
    waits = {r.job_id: r for r in d.pending}
    assert binds | set(waits) == {j.id for j in case["pending"]}
    if "binds" in case:
        assert binds == set(case["binds"]), (d.binds, d.pending)
    for jid, code in case.get("waits", {}).items():
        assert jid in waits, f"{jid} was bound"
        assert waits[jid].code == code, waits[jid]
    if "preempts" in case:
        assert {p.victim_id: p.reason for p in d.preemptions} == case["preempts"], d.preemptions
    # deterministic whatever the order of the pending list
    d2 = schedule(
        Snapshot(now=snap.now, cluster=snap.cluster, pending=snap.pending[::-1], queues=snap.queues), policy
    )
    assert d2 == d
