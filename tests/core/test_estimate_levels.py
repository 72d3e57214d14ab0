"""Rallypoint's levels by expected remaining work (``level_by_estimate``): the level arithmetic, the
per-job and vectorized ranks agreeing, and what the order and the preemption planner do with them."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest

from rallypoint.core import Snapshot, policy_by_name, schedule
from rallypoint.core.context import Ctx
from rallypoint.core.ordering import ClassLasOrder, estimate_level, estimate_levels

from .builders import ALL, cluster, nodes, pending, running


def _tie(j: Any) -> tuple[float, int, str]:
    return (j.submit_time, j.arrival, j.id)


N2 = nodes(racks=1, per_rack=2)  # 16 GPUs
UNIT = 600.0


@pytest.mark.parametrize(
    ("rem", "level"),
    [
        (0.0, 0),
        (599.999, 0),
        (600.0, 1),
        (1199.0, 1),
        (1200.0, 2),
        (600.0 * 2**10, 11),
        (600.0 * 2**10 - 1e-9, 10),
        (1e300, 63),
        (math.nan, 0),
        (-5.0, 0),
    ],
)
def test_estimate_level_is_one_per_doubling_above_the_unit(rem: float, level: int) -> None:
    assert estimate_level(rem, UNIT) == level
    assert estimate_levels(np.array([rem]), UNIT).tolist() == [float(level)]


def test_scalar_and_vectorized_levels_agree_everywhere() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        (
            rng.uniform(0, 1e7, 2000),
            UNIT * 2.0 ** np.arange(-3, 40),  # exact boundaries
            np.nextafter(UNIT * 2.0 ** np.arange(0, 40), 0),  # just below them
        )
    )
    assert estimate_levels(values, UNIT).tolist() == [float(estimate_level(float(v), UNIT)) for v in values]


def test_running_rank_array_equals_running_rank() -> None:
    now = 10_000.0
    jobs = [
        running("no-estimate", {"s0r0n0": (0,)}, start_time=0.0, attained_gpu_s=3000.0),
        running("long-left", {"s0r0n0": (1, 2)}, start_time=9000.0, expected_end=now + 86400),
        running("ending", {"s0r0n0": (3,)}, start_time=100.0, expected_end=now + 30),
        running("outrun", {"s0r0n0": (4, 5)}, start_time=0.0, expected_end=now - 5, attained_gpu_s=10.0),
        running("exact-end", {"s0r0n0": (6,)}, start_time=0.0, expected_end=now),
        running("be", {"s0r0n1": ALL}, start_time=5.0, priority_class="best-effort", expected_end=now + 1e5),
    ]
    c = cluster(N2, jobs)
    for overrides in ({}, {"level_by_estimate": False}, {"strict_class_min": 800}):
        policy = policy_by_name("rallypoint", overrides)
        ctx = Ctx(Snapshot(now=now, cluster=c), policy.config)
        order = ClassLasOrder()
        arr = order.running_rank_array(c.cols, ctx)
        for slot, jid in enumerate(c.cols.ids[: c.cols.n]):
            assert arr[slot] == order.running_rank(c.running[jid], ctx), (overrides, jid)


def test_outrun_estimate_falls_back_to_attained_service() -> None:
    now = 10_000.0
    c = cluster(N2)
    ctx = Ctx(Snapshot(now=now, cluster=c), policy_by_name("rallypoint").config)
    order = ClassLasOrder()
    outrun = running("j", {"s0r0n0": ALL}, start_time=0.0, expected_end=now - 1)
    assert order.running_level(outrun, ctx) == estimate_level(8 * now, UNIT)
    within = running("j", {"s0r0n0": ALL}, start_time=0.0, expected_end=now + 100)
    assert order.running_level(within, ctx) == estimate_level(800.0, UNIT) == 1


CASES: list[dict[str, Any]] = [
    dict(
        id="shortest-expected-work-first-inside-a-class",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("long", 8, submit=1, time_limit_s=86400.0),
            pending("short", 8, submit=2, time_limit_s=600.0),
        ],
        binds={"short"},
        waits={"long": "Resources"},
        differs_from_attained_las=True,
    ),
    dict(
        id="work-is-gpus-times-time-left",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("wide", 8, gpt=1, submit=1, time_limit_s=3600.0),  # 28,800 GPU-s
            pending("narrow-longer", 4, gpt=1, submit=2, time_limit_s=4000.0),  # 16,000 GPU-s
        ],
        binds={"narrow-longer"},
    ),
    dict(
        id="without-an-estimate-attained-service-is-the-expected-rest",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("limited", 8, submit=1, time_limit_s=3600.0),  # 28,800 GPU-s left: level 6
            pending("unknown-served", 8, submit=2, attained_gpu_s=5000.0),  # level 4
        ],
        binds={"unknown-served"},
    ),
    dict(
        id="a-strict-class-still-first",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("short-std", 8, submit=1, time_limit_s=60.0),
            pending("long-high", 8, submit=2, time_limit_s=7 * 86400.0, priority_class="training-high"),
        ],
        binds={"long-high"},
    ),
    dict(
        id="below-the-strict-classes-the-shorter-job-first",
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL})]),
        pending=[
            pending("short-be", 8, submit=2, time_limit_s=60.0, priority_class="best-effort"),
            pending("long-std", 8, submit=1, time_limit_s=7 * 86400.0),
        ],
        binds={"short-be"},
    ),
    dict(
        # equal attained service would make them equal LAS victims; the one with the most work left goes,
        # not the one about to finish
        id="las-victim-is-the-job-with-most-work-left",
        now=50_000.0,
        cluster=cluster(
            N2,
            [
                running("ending", {"s0r0n0": ALL}, start_time=0.0, expected_end=50_100.0),
                running("far", {"s0r0n1": ALL}, start_time=0.0, expected_end=500_000.0),
            ],
        ),
        pending=[pending("short", 8, submit=49_990.0, time_limit_s=1800.0)],
        preempts={"far": "las"},
        differs_from_attained_las=True,
    ),
    dict(
        id="no-las-victim-with-less-work-left-than-the-preemptor",
        now=50_000.0,
        cluster=cluster(
            N2,
            [
                running("a", {"s0r0n0": ALL}, start_time=0.0, expected_end=50_300.0),
                running("b", {"s0r0n1": ALL}, start_time=0.0, expected_end=50_400.0),
            ],
        ),
        pending=[pending("big", 8, submit=49_990.0, time_limit_s=86400.0)],
        waits={"big": "Resources"},
        preempts={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_order_and_preemption_by_expected_work(case: dict[str, Any]) -> None:
    policy = policy_by_name("rallypoint")
    snap = Snapshot(now=case.get("now", 100.0), cluster=case["cluster"], pending=tuple(case["pending"]))
    d = schedule(snap, policy)
    binds = {b.job_id for b in d.binds}
    waits = {r.job_id: r for r in d.pending}
    if "binds" in case:
        assert binds == case["binds"], (d.binds, d.pending)
    for jid, code in case.get("waits", {}).items():
        assert waits[jid].code == code, waits[jid]
    if "preempts" in case:
        assert {p.victim_id: p.reason for p in d.preemptions} == case["preempts"], d.preemptions
    # the same with LAS levels by attained service instead: the estimate is what decided
    if case.get("differs_from_attained_las"):
        d_las = schedule(snap, policy_by_name("rallypoint", {"level_by_estimate": False}))
        assert {b.job_id for b in d_las.binds} != binds or {p.victim_id for p in d_las.preemptions} != {
            p.victim_id for p in d.preemptions
        }


def test_the_orders_inlined_levels_equal_pending_level() -> None:
    """``ClassLasOrder.order`` computes levels inline (hot loop); on an empty cluster without quotas (every
    share 0, every job tier 1) its order is the sort by (-band, pending_level, -class, submit, arrival,
    id)."""
    rng = np.random.default_rng(11)
    classes = ("training-high", "training-standard", "best-effort")
    jobs = []
    for i in range(400):
        kind = int(rng.integers(0, 4))
        jobs.append(
            pending(
                f"j{i}",
                int(rng.choice([1, 2, 4, 8, 16])),
                submit=float(rng.integers(0, 50)),  # repeated submit times: the whole tie key decides
                arrival=i,
                priority_class=classes[int(rng.integers(0, 3))],
                attained_gpu_s=float(rng.choice([0.0, 599.0, 600.0, 5000.0, 1e6])),
                time_limit_s=None if kind == 0 else float(rng.choice([60.0, 600.0, 3600.0, 86400.0])),
                expected_runtime_s=float(rng.uniform(1, 1e5)) if kind == 3 else None,
            )
        )
    c = cluster(nodes(racks=1, per_rack=4))
    for overrides in ({}, {"strict_class_min": 800}):
        ctx = Ctx(Snapshot(now=100.0, cluster=c), policy_by_name("rallypoint", overrides).config)
        order = ClassLasOrder()

        keyed = []
        for j in jobs:
            p = ctx.prio_of(j)
            keyed.append(((-order.band(p, ctx), order.pending_level(j, ctx), -p, *_tie(j)), j.id))
        expected = [jid for _k, jid in sorted(keyed)]
        assert [j.id for j in order.order(jobs, ctx)] == expected, overrides


def test_a_level_unit_that_is_not_positive_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="estimate_level_gpu_s"):
        policy_by_name("rallypoint", {"estimate_level_gpu_s": 0})
