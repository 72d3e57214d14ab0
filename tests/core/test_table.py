"""Table-driven policy tests: clusters, queues and jobs as data; expected binds, evictions, reasons as data.

Each case: ``policy`` name (or (name, overrides)), ``cluster`` (nodes, running jobs, unhealthy nodes),
``pending`` jobs, optional ``queues``/``now``, and expectations:
``binds`` {job: {node: gpus} or set of nodes or int GPU count}, ``waits`` {job: code},
``preempts`` {victim: reason}, ``resizes`` {job: new GPU count}, ``says`` {job: substring of the message}.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from rallypoint.core import Decisions, Queue, Quota, Snapshot, policy_by_name, schedule

from .builders import ALL, cluster, nodes, pending, running

N2 = nodes(racks=1, per_rack=2)  # s0r0n0, s0r0n1: 16 GPUs

CASES: list[dict[str, Any]] = [
    # --- gang / the design doc's deadlock --------------------------------------------------------
    dict(
        id="deadlock-two-64-gpu-gangs-on-100-free",
        policy="fifo",
        cluster=cluster(nodes(racks=1, per_rack=13), [running("r", {"s0r0n12": (0, 1, 2, 3)})]),
        pending=[pending("a", 64, 8, submit=1), pending("b", 64, 8, submit=2)],
        binds={"a": 64},
        waits={"b": "Resources"},
        says={"b": "needs 64 GPUs in the cluster; 36 free"},
    ),
    dict(
        id="deadlock-rallypoint-one-runs-other-holds-nothing",
        policy="rallypoint",
        cluster=cluster(nodes(racks=1, per_rack=13), [running("r", {"s0r0n12": (0, 1, 2, 3)})]),
        pending=[pending("a", 64, 8, submit=1), pending("b", 64, 8, submit=2)],
        binds={"a": 64},
        waits={"b": "Resources"},
    ),
    # --- fifo ---------------------------------------------------------------------------------------
    dict(
        id="fifo-stops-at-first-blocked-job",
        policy="fifo",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[pending("big", 16, 8, submit=1), pending("small", 1, submit=2)],
        binds={},
        waits={"big": "Resources", "small": "Priority"},
        says={"small": "head-of-line job big"},
    ),
    dict(
        id="fifo-first-fit-vs-rallypoint-best-fit",
        policy="fifo",
        cluster=cluster(N2, [running("r", {"s0r0n1": (0, 1, 2, 3, 4, 5)})]),
        pending=[pending("j", 2)],
        binds={"j": {"s0r0n0": (0, 1)}},
    ),
    dict(
        id="rallypoint-best-fit-packs-the-fuller-node",
        policy="rallypoint",
        cluster=cluster(N2, [running("r", {"s0r0n1": (0, 1, 2, 3, 4, 5)})]),
        pending=[pending("j", 2)],
        binds={"j": {"s0r0n1": (6, 7)}},
    ),
    dict(
        id="fifo-consolidates-small-jobs-on-one-node",
        policy="fifo",
        cluster=cluster(N2, [running("r", {"s0r0n0": (0, 1, 2, 3, 4, 5), "s0r0n1": (0, 1, 2, 3, 4, 5)})]),
        pending=[pending("j", 4, 1)],
        waits={"j": "Topology"},
        says={"j": "needs 4 GPUs in one node; best node has 2 free"},
    ),
    # --- topology -----------------------------------------------------------------------------------
    dict(
        id="required-rack-not-available",
        policy="rallypoint",
        cluster=cluster(
            nodes(racks=2, per_rack=8),
            [running("x", {"s0r0n0": ALL, "s0r0n1": ALL}), running("y", {"s0r1n0": ALL, "s0r1n1": ALL})],
        ),
        pending=[pending("j", 64, 8, topology_required="rack")],
        waits={"j": "Topology"},
        says={"j": "needs 64 GPUs in one rack; best rack has 48 free"},
    ),
    dict(
        id="preferred-rack-spills-to-spine",
        policy="rallypoint",
        cluster=cluster(
            nodes(racks=2, per_rack=8),
            [running("x", {"s0r0n0": ALL, "s0r0n1": ALL}), running("y", {"s0r1n0": ALL, "s0r1n1": ALL})],
        ),
        pending=[pending("j", 64, 8, topology_preferred="rack")],
        binds={"j": 64},
    ),
    dict(
        id="gang-lands-in-the-tightest-rack-that-holds-it",
        policy="rallypoint",
        cluster=cluster(nodes(racks=2, per_rack=4), [running("x", {"s0r1n0": ALL})]),
        pending=[pending("j", 24, 8)],
        binds={"j": {"s0r1n1", "s0r1n2", "s0r1n3"}},
    ),
    dict(
        id="nvlink-task-stays-in-one-domain",
        policy="rallypoint",
        cluster=cluster(
            nodes(per_rack=1, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))), [running("x", {"s0r0n0": (2, 3, 7)})]
        ),
        pending=[pending("two", 2, submit=1), pending("three", 3, submit=2)],
        binds={"two": {"s0r0n0": (0, 1)}, "three": {"s0r0n0": (4, 5, 6)}},
    ),
    dict(
        id="nvlink-domain-too-fragmented",
        policy="rallypoint",
        cluster=cluster(
            nodes(per_rack=1, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))), [running("x", {"s0r0n0": (0, 1, 4, 5)})]
        ),
        pending=[pending("j", 4)],
        waits={"j": "Topology"},
    ),
    *[
        dict(
            id=f"required-nvlink-passes-over-a-best-fit-node-with-smaller-domains-{pol}",
            policy=pol,
            # the best fit (6 free) has two 4-GPU domains; only the other node holds 6 GPUs in one domain
            cluster=cluster(
                nodes(per_rack=1, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))) + nodes(per_rack=1, prefix="b"),
                [running("x", {"s0r0n0": (0, 1)})],
            ),
            pending=[pending("j", 6, topology_required="nvlink")],
            binds={"j": {"bs0r0n0": (0, 1, 2, 3, 4, 5)}},
        )
        for pol in ("fifo", "easy-backfill", "las", "rallypoint")
    ],
    dict(
        id="gang-too-large",
        policy="rallypoint",
        cluster=cluster(N2),
        pending=[pending("j", 1024, 8)],
        waits={"j": "GangTooLarge"},
        says={"j": "largest cluster has 16"},
    ),
    dict(
        id="node-unhealthy",
        policy="easy-backfill",
        cluster=cluster(N2, unhealthy=("s0r0n1",)),
        pending=[pending("j", 16, 8)],
        waits={"j": "NodeUnhealthy"},
    ),
    dict(
        id="unknown-gpu-type",
        policy="fifo",
        cluster=cluster(N2),
        pending=[pending("j", 8, gpu_type="b200")],
        waits={"j": "GangTooLarge"},
    ),
    # --- priority, aging, DRF -----------------------------------------------------------------------
    dict(
        id="priority-order-beats-submission-order",
        policy="easy-backfill",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("low", 8, submit=1, priority_class="development"),
            pending("high", 8, submit=2, priority_class="training-high"),
        ],
        binds={"high": 8},
        waits={"low": "Resources"},
    ),
    dict(
        id="aging-lifts-a-long-waiting-job",
        # cross-class aging is the classic order (class_las off); class_las keeps classes strict
        policy=("rallypoint", {"class_las": False, "aging_step": 50, "aging_interval_s": 3600.0}),
        now=100 * 3600.0,
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("old", 8, submit=0, priority_class="best-effort"),
            pending("new", 8, submit=100 * 3600.0 - 1, priority_class="development"),
        ],
        binds={"old": 8},
    ),
    dict(
        id="drf-favours-the-team-with-the-smaller-share",
        policy="rallypoint",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, team="a")]),
        pending=[pending("a2", 8, submit=1, team="a"), pending("b1", 8, submit=2, team="b")],
        binds={"b1": 8},
        waits={"a2": "Resources"},
    ),
    # --- quotas and cohorts -------------------------------------------------------------------------
    dict(
        id="quota-exceeded-without-cohort",
        policy="rallypoint",
        cluster=cluster(N2),
        queues=[Queue(name="a", quotas=(Quota(nominal=8),))],
        pending=[pending("j", 16, 8, team="a")],
        waits={"j": "QuotaExceeded"},
        says={"j": "queue a uses 0 of 8 nominal"},
    ),
    dict(
        id="borrow-idle-quota-from-cohort",
        policy="rallypoint",
        cluster=cluster(N2),
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
        ],
        pending=[pending("j", 16, 8, team="a")],
        binds={"j": 16},
    ),
    dict(
        id="lending-limit-caps-borrowing",
        policy="rallypoint",
        cluster=cluster(N2),
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8, lending_limit=4),)),
        ],
        pending=[pending("j", 16, 8, team="a")],
        waits={"j": "QuotaExceeded"},
        says={"j": "cohort can lend 4"},
    ),
    dict(
        id="borrowing-limit",
        policy="rallypoint",
        cluster=cluster(N2),
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=4, borrowing_limit=4),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=12),)),
        ],
        pending=[pending("j", 16, 8, team="a")],
        waits={"j": "QuotaExceeded"},
    ),
    dict(
        id="parent-org-caps-children",
        policy="rallypoint",
        cluster=cluster(N2),
        queues=[
            Queue(name="org", quotas=(Quota(nominal=8),)),
            Queue(name="a", parent="org", quotas=(Quota(nominal=16),)),
        ],
        pending=[pending("j", 16, 8, team="a")],
        waits={"j": "QuotaExceeded"},
        says={"j": "org org uses 0 of 8"},
    ),
    # --- preemption ---------------------------------------------------------------------------------
    dict(
        id="reclaim-borrowed-quota-even-from-higher-priority",
        policy="rallypoint",
        cluster=cluster(
            N2, [running("bjob", {"s0r0n0": ALL, "s0r0n1": ALL}, team="b", priority_class="training-high")]
        ),
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
        ],
        pending=[pending("aj", 8, team="a", priority_class="development")],
        preempts={"bjob": "reclaim"},
        waits={"aj": "Preempting"},
    ),
    dict(
        id="priority-preemption-picks-least-work-lost",
        policy="rallypoint",
        now=1000.0,
        cluster=cluster(
            N2,
            [
                running("old-ckpt", {"s0r0n0": ALL}, priority_class="best-effort", last_checkpoint=100.0),
                running("fresh-ckpt", {"s0r0n1": ALL}, priority_class="best-effort", last_checkpoint=990.0),
            ],
        ),
        pending=[pending("prod", 8, priority_class="production")],
        preempts={"fresh-ckpt": "priority"},
        waits={"prod": "Preempting"},
    ),
    dict(
        id="preemption-frees-the-right-shape",
        policy="rallypoint",
        now=1000.0,  # past the victims' start protection
        cluster=cluster(
            nodes(racks=2, per_rack=2),
            [
                running("x", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort"),
                running("y", {"s0r1n0": ALL}, priority_class="best-effort"),
            ],
        ),
        pending=[pending("prod", 16, 8, priority_class="production", topology_required="rack")],
        preempts={"y": "priority"},
    ),
    dict(
        id="never-preempt-equal-priority",
        policy="rallypoint",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL, "s0r0n1": ALL})]),
        pending=[pending("j", 8)],
        preempts={},
        waits={"j": "Resources"},
    ),
    dict(
        id="recently-preempted-job-is-protected",
        policy="rallypoint",
        now=1000.0,
        cluster=cluster(
            N2,
            [
                running(
                    "r", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort", last_preempted_at=900.0
                )
            ],
        ),
        pending=[pending("j", 8, priority_class="production")],
        preempts={},
        waits={"j": "Resources"},
    ),
    dict(
        id="non-preemptible-job-is-safe",
        policy="rallypoint",
        cluster=cluster(
            N2,
            [running("r", {"s0r0n0": ALL, "s0r0n1": ALL}, priority_class="best-effort", preemptible=False)],
        ),
        pending=[pending("j", 8, priority_class="production")],
        preempts={},
    ),
    # --- preemption: fixes (minimal victim sets, reclaim stops at nominal, stopping victims) -----------
    dict(
        # A (cheapest: least work lost) is walked first but the gang fits on B's GPUs plus the free ones:
        # A must not be evicted (it used to be: victims were only ever added, never dropped)
        id="preemption-drops-victims-the-gang-does-not-need",
        policy="rallypoint",
        now=1000.0,
        cluster=cluster(
            nodes(per_rack=1),
            [
                running("a", {"s0r0n0": (0, 1)}, priority_class="best-effort", last_checkpoint=990.0),
                running("b", {"s0r0n0": (2, 3, 4, 5)}, priority_class="best-effort", last_checkpoint=100.0),
            ],
        ),
        pending=[pending("prod", 6, priority_class="production")],
        preempts={"b": "priority"},
        waits={"prod": "Preempting"},
    ),
    dict(
        # queue b borrows 8 above its nominal: reclaiming b1 brings it back to nominal, so b2 (same
        # priority as the preemptor) stays; the rest comes from x, a lower-priority job. (It used to evict
        # both b1 and b2, leaving b 8 GPUs below its guaranteed quota.)
        id="reclaim-stops-once-the-queue-is-back-at-nominal",
        # classic rule: a lower-priority job of a queue within its nominal may still be a priority victim
        policy=("rallypoint", {"class_las": False}),
        now=1000.0,
        cluster=cluster(
            nodes(per_rack=3),
            [
                running("b1", {"s0r0n0": ALL}, team="b", last_checkpoint=990.0),
                running("b2", {"s0r0n1": ALL}, team="b", last_checkpoint=980.0),
                running("x", {"s0r0n2": ALL}, team="c", priority_class="best-effort"),
            ],
        ),
        queues=[
            Queue(name="a", cohort="org", quotas=(Quota(nominal=16),)),
            Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
            Queue(name="c", cohort="org", quotas=(Quota(nominal=8),)),
        ],
        pending=[pending("aj", 16, 8, team="a")],
        preempts={"b1": "reclaim", "x": "priority"},
        waits={"aj": "Preempting"},
    ),
    dict(
        # v1 is still stopping for prod (the caller marked it preempting_for); v2 already stopped and
        # freed s0r0n1. "other" ranks first and fits on s0r0n1, but those GPUs are held for prod alone
        id="stopping-victims-keep-freed-gpus-for-their-preemptor",
        policy="rallypoint",
        cluster=cluster(
            N2, [running("v1", {"s0r0n0": ALL}, priority_class="best-effort", preempting_for="prod")]
        ),
        pending=[
            pending("other", 8, submit=0, priority_class="production"),
            pending("prod", 16, 8, submit=1, priority_class="production"),
        ],
        binds={},
        preempts={},
        waits={"prod": "Preempting", "other": "Reservation"},
        says={"prod": "waiting for 1 preempted job to stop (v1)", "other": "would delay job prod"},
        reserved={"prod": None},
    ),
    dict(
        # once its victims are gone the preemptor binds like anyone else
        id="preemptor-binds-when-its-victims-have-stopped",
        policy="rallypoint",
        cluster=cluster(N2),
        pending=[
            pending("other", 8, submit=0, priority_class="production"),
            pending("prod", 16, 8, submit=1, priority_class="production"),
        ],
        binds={"other": 8},
        waits={"prod": "Resources"},
    ),
    dict(
        # a job still stopping for someone else is never chosen again; the next cheapest victim is
        id="stopping-victim-is-not-preempted-twice",
        policy="rallypoint",
        now=1000.0,
        cluster=cluster(
            N2,
            [
                running(
                    "v1",
                    {"s0r0n0": ALL},
                    priority_class="best-effort",
                    last_checkpoint=999.0,
                    preempting_for="gone",
                ),
                running("be2", {"s0r0n1": ALL}, priority_class="best-effort", last_checkpoint=0.0),
            ],
        ),
        pending=[pending("prod2", 8, priority_class="production")],
        preempts={"be2": "priority"},
        waits={"prod2": "Preempting"},
    ),
    # --- EASY backfill ------------------------------------------------------------------------------
    dict(
        id="easy-reserves-head-and-backfills-short-job",
        policy="easy-backfill",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, expected_end=1000.0)]),
        pending=[
            pending("head", 16, 8, submit=1, priority_class="training-high"),
            pending("short", 8, submit=2, time_limit_s=500.0),
        ],
        binds={"short": 8},
        reserved={"head": 1000.0},
        waits={"head": "Resources"},
        says={"head": "earliest start in ~15 min"},
    ),
    dict(
        # both short jobs fit on the held node, but only one of them can have it: a backfilled job's GPUs
        # leave the hold (the second probe used to give them back and bind the same GPUs twice)
        id="easy-backfills-held-gpus-only-once",
        policy="easy-backfill",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, expected_end=1000.0)]),
        pending=[
            pending("head", 16, 8, submit=1, priority_class="training-high"),
            pending("short1", 8, submit=2, time_limit_s=500.0),
            pending("short2", 8, submit=3, time_limit_s=500.0),
        ],
        binds={"short1": {"s0r0n1": ALL}},
        waits={"head": "Resources", "short2": "Resources"},
    ),
    dict(
        id="easy-refuses-backfill-that-delays-head",
        policy="easy-backfill",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, expected_end=1000.0)]),
        pending=[
            pending("head", 16, 8, submit=1, priority_class="training-high"),
            pending("long", 8, submit=2, time_limit_s=5000.0),
            pending("unknown", 8, submit=3),
        ],
        binds={},
        waits={"head": "Resources", "long": "Reservation", "unknown": "Reservation"},
    ),
    dict(
        id="easy-uses-learned-runtime-before-time-limit",
        policy="easy-backfill",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, expected_end=1000.0)]),
        pending=[
            pending("head", 16, 8, submit=1, priority_class="training-high"),
            pending("learned", 8, submit=2, time_limit_s=5000.0, expected_runtime_s=300.0),
        ],
        binds={"learned": 8},
    ),
    # --- elastic ------------------------------------------------------------------------------------
    dict(
        id="elastic-starts-at-largest-size-that-fits",
        policy="rallypoint",
        cluster=cluster(nodes(per_rack=4), [running("r", {"s0r0n0": ALL, "s0r0n1": ALL})]),
        pending=[pending("e", 32, 8, min_gpus=8, max_gpus=32, gpu_step=8)],
        binds={"e": 16},
    ),
    dict(
        id="elastic-shrinks-before-anyone-is-preempted",
        policy="rallypoint",
        cluster=cluster(
            nodes(per_rack=4),
            [
                running(
                    "el",
                    {f"s0r0n{i}": ALL for i in range(3)},
                    priority_class="training-standard",
                    min_gpus=8,
                    max_gpus=24,
                    gpu_step=8,
                    gpus_per_task=8,
                ),
                running("be", {"s0r0n3": ALL}, priority_class="best-effort"),
            ],
        ),
        pending=[pending("prod", 8, priority_class="production")],
        preempts={},
        resizes={"el": 16},
    ),
    dict(
        id="elastic-grows-into-idle-gpus",
        policy="rallypoint",
        cluster=cluster(
            nodes(per_rack=4),
            [running("el", {"s0r0n0": ALL}, min_gpus=8, max_gpus=24, gpu_step=8, gpus_per_task=8)],
        ),
        pending=[],
        resizes={"el": 24},
    ),
    # --- LAS ----------------------------------------------------------------------------------------
    dict(
        id="las-orders-by-attained-service",
        policy="las",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, start_time=0.0)]),
        now=10.0,
        pending=[
            pending("served", 8, submit=1, attained_gpu_s=5000.0),
            pending("fresh", 8, submit=2),
        ],
        binds={"fresh": 8},
        waits={"served": "Resources"},
    ),
    dict(
        id="las-preempts-job-in-a-lower-queue",
        policy="las",
        now=1000.0,
        cluster=cluster(N2, [running("hog", {"s0r0n0": ALL, "s0r0n1": ALL}, start_time=0.0)]),
        pending=[pending("fresh", 8, submit=900.0)],
        preempts={"hog": "las"},
    ),
]


def _run(case: dict[str, Any]) -> Decisions:
    pol = case["policy"]
    policy = policy_by_name(*pol) if isinstance(pol, tuple) else policy_by_name(pol)
    snap = Snapshot(
        now=case.get("now", 100.0),
        cluster=case["cluster"],
        pending=tuple(case["pending"]),
        queues=tuple(case.get("queues", ())),
    )
    return schedule(snap, policy)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_table(case: dict[str, Any]) -> None:
    d = _run(case)
    binds = {b.job_id: b for b in d.binds}
    waits = {r.job_id: r for r in d.pending}
    # every pending job is either bound or has exactly one reason
    assert set(binds) | set(waits) == {j.id for j in case["pending"]}
    assert not set(binds) & set(waits)
    assert len(waits) == len(d.pending)
    if "binds" in case:
        assert set(binds) == set(case["binds"]), (d.binds, d.pending)
        for jid, want in case["binds"].items():
            b = binds[jid]
            if isinstance(want, int):
                assert b.gpus == want
            elif isinstance(want, set):
                assert {p.node_id for p in b.placements} == want
            else:
                assert {p.node_id: p.gpus for p in b.placements} == want
    for jid, code in case.get("waits", {}).items():
        assert jid in waits, f"{jid} was bound"
        assert waits[jid].code == code, waits[jid]
    for jid, text in case.get("says", {}).items():
        assert text in waits[jid].message, waits[jid].message
    if "preempts" in case:
        assert {p.victim_id: p.reason for p in d.preemptions} == case["preempts"], d
    if "resizes" in case:
        assert {r.job_id: r.gpus for r in d.resizes} == case["resizes"], d
    for jid, t in case.get("reserved", {}).items():
        assert [r.start_estimate for r in d.reservations if r.job_id == jid] == [t]
    # deterministic: same input twice, and pending order reversed, give byte-identical output
    again = _run(case)
    assert msgspec.json.encode(again) == msgspec.json.encode(d)
    rev = dict(case, pending=list(reversed(case["pending"])))
    assert msgspec.json.encode(_run(rev)) == msgspec.json.encode(d)


def test_positions_are_queue_order() -> None:
    c = cluster(N2, [running("r", {"s0r0n0": ALL, "s0r0n1": ALL})])
    snap = Snapshot(now=0.0, cluster=c, pending=tuple(pending(f"j{i}", 8, submit=i) for i in range(5)))
    d = schedule(snap, policy_by_name("easy-backfill"))
    assert [(r.job_id, r.position) for r in d.pending] == [(f"j{i}", i) for i in range(5)]
    assert "2 jobs ahead" in d.pending[2].message


def test_schedule_does_not_mutate_the_cluster() -> None:
    c = cluster(N2)
    before = (dict(c.usage), [c.free_gpus(n) for n in sorted(c.nodes)])
    snap = Snapshot(now=0.0, cluster=c, pending=(pending("a", 8), pending("b", 8)))
    d = schedule(snap, policy_by_name("rallypoint"))
    assert len(d.binds) == 2
    assert (dict(c.usage), [c.free_gpus(n) for n in sorted(c.nodes)]) == before


def test_unknown_policy() -> None:
    with pytest.raises(KeyError):
        policy_by_name("nope")


@pytest.mark.parametrize("policy", ["fifo", "easy-backfill", "las", "rallypoint"])
def test_decisions_do_not_depend_on_bind_history(policy: str) -> None:
    """The running-job columns are kept by swap-remove, so their slot order is history: decisions must
    not be. Same running jobs bound in reverse order, with churn, give byte-identical decisions."""
    from rallypoint.bench.corebench import build_workload
    from rallypoint.core import ClusterModel

    c1, pend, queues, now = build_workload(352, 8, 300, seed=3)
    jobs = [c1.running[j] for j in sorted(c1.running)]
    c2 = ClusterModel(c1.nodes.values())
    for j in reversed(jobs):
        c2.bind(j)
    for j in jobs[::7]:  # churn: unbind and bind again
        c2.unbind(j.id)
    for j in jobs[::7]:
        c2.bind(j)
    pol = policy_by_name(policy)
    d1 = schedule(Snapshot(now=now, cluster=c1, pending=pend, queues=queues), pol)
    d2 = schedule(Snapshot(now=now, cluster=c2, pending=tuple(reversed(pend)), queues=queues), pol)
    assert msgspec.json.encode(d1) == msgspec.json.encode(d2)
    if policy in ("las", "rallypoint"):
        assert d1.preemptions  # the preemption planner (the columns' main reader) is exercised
