"""Small hand-computed scenarios with exact expected times, run through the real core."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.sim.cluster import cluster_from_obj
from rallypoint.sim.engine import SimOptions, Simulator
from rallypoint.sim.run import resolve_policy
from rallypoint.sim.workload import Job


def sim(jobs: list[Job], cluster: dict[str, Any], policy: str = "fifo", **kw: Any) -> dict[str, Any]:
    res = Simulator(
        jobs, cluster_from_obj(cluster), policy, None, SimOptions(**kw), policy_obj=resolve_policy(policy)
    ).run()
    return {"res": res, "by": {r.id: r for r in res.records}}


ONE_NODE = {"generator": {"racks": 1, "nodes_per_rack": 1, "gpus_per_node": 8}}


def J(id: str, submit: float, gpus: int, dur: float, **kw: Any) -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=dur, team=kw.pop("team", "t"), **kw)


def test_fifo_head_of_line_blocks_and_no_backfill() -> None:
    # A takes 4 of 8 GPUs until 100; B (8 GPUs) must wait for A; C (2 GPUs, arrives at 10) would fit at once
    # but strict FIFO keeps it behind B: B runs 100-150, C 150-180.
    out = sim([J("a", 0, 4, 100), J("b", 0, 8, 50), J("c", 10, 2, 30)], ONE_NODE)["by"]
    assert [(out[k].start, out[k].end) for k in "abc"] == [(0, 100), (100, 150), (150, 180)]


def test_easy_backfill_runs_a_short_job_that_does_not_delay_the_reservation() -> None:
    jobs = [
        J("a", 0, 4, 100, time_limit=100),
        J("b", 0, 8, 50, time_limit=50),
        J("c", 10, 2, 30, time_limit=30),
    ]
    out = sim(jobs, ONE_NODE, "easy-backfill")["by"]
    assert (out["c"].start, out["c"].end) == (10, 40)
    assert (out["b"].start, out["b"].end) == (100, 150)


def test_gpus_freed_at_t_are_reused_at_t() -> None:
    out = sim([J("a", 0, 8, 10), J("b", 10, 8, 5), J("c", 3, 1, 7)], ONE_NODE)["by"]
    # c (submitted 3) waits behind nothing but GPUs: a holds all 8 until 10; at 10 a ends first, then b
    # joins behind c, and both fit (1 + 8 > 8? no): c starts at 10, b must wait for c (ends 17).
    assert (out["c"].start, out["c"].end) == (10, 17)
    assert (out["b"].start, out["b"].end) == (17, 22)


def test_gang_spans_two_nodes_in_one_rack() -> None:
    cl = {"generator": {"racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8}}
    r = sim([J("g", 0, 16, 60)], cl)["by"]["g"]
    assert (r.start, r.end, r.nodes, r.racks) == (0, 60, 2, 1)


def test_node_failure_loses_work_back_to_checkpoint() -> None:
    # 1,000 s of work, checkpoint every 300 s; the node dies at 700 (checkpoint at 600 kept) for 100 s.
    # Restart at 800 pays a 20 s restore, then 400 s of work: ends at 1,220.
    cl = dict(
        ONE_NODE,
        faults={"checkpoint_overhead": 20, "events": [{"node": "r000-n00", "at": 700, "down_for": 100}]},
    )
    out = sim([J("a", 0, 8, 1000, checkpoint_interval=300)], cl)
    r = out["by"]["a"]
    assert (r.start, r.end, r.failures) == (0, 1220, 1)
    assert r.lost_gpu_s == pytest.approx(100 * 8 + 20 * 8)
    assert r.run_time == pytest.approx(700 + 420)
    assert r.queue_delay == pytest.approx(100)
    assert out["res"].summary["gpu_hours_lost"] == pytest.approx(960 / 3600)


def test_failure_without_checkpoint_restarts_from_zero() -> None:
    cl = dict(ONE_NODE, faults={"events": [{"node": "r000-n00", "at": 50, "down_for": 10}]})
    r = sim([J("a", 0, 2, 100)], cl)["by"]["a"]
    assert (r.start, r.end) == (0, 160)


def test_random_failures_are_deterministic_per_seed() -> None:
    cl = {
        "generator": {"racks": 1, "nodes_per_rack": 4, "gpus_per_node": 8},
        "faults": {"node_mtbf": 2000, "repair_time": 100, "checkpoint_overhead": 5},
    }
    jobs = [J(f"j{i}", i * 7, 1 + i % 8, 300 + 11 * i, checkpoint_interval=60) for i in range(40)]
    a = sim(jobs, cl, seed=3)["res"]
    b = sim(jobs, cl, seed=3)["res"]
    c = sim(jobs, cl, seed=4)["res"]
    key = [(r.id, r.start, r.end, r.failures) for r in a.records]
    assert key == [(r.id, r.start, r.end, r.failures) for r in b.records]
    assert key != [(r.id, r.start, r.end, r.failures) for r in c.records]
    assert a.summary["completed"] == 40 and a.summary["failures"] > 0


def test_gpu_type_constraint_is_honoured() -> None:
    cl = {
        "nodes": [
            {"id": "a", "rack": "r", "gpus": 4, "gpu_type": "T4"},
            {"id": "b", "rack": "r", "gpus": 4, "gpu_type": "V100"},
        ]
    }
    out = sim(
        [
            J("x", 0, 4, 10, gpu_type="V100"),
            J("y", 0, 4, 10, gpu_type="T4|P100"),
            J("z", 0, 4, 10, gpu_type="V100"),
        ],
        cl,
    )["by"]
    assert out["x"].placed_gpu_type == "V100" and out["y"].placed_gpu_type == "T4"
    assert (out["z"].start, out["z"].end) == (10, 20)


@pytest.mark.parametrize("policy", ["fifo", "easy-backfill", "las", "rallypoint"])
def test_every_policy_finishes_every_job(policy: str) -> None:
    cl = {"generator": {"racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8}}
    jobs = [
        J(
            f"j{i:02d}",
            (i * 37) % 400,
            [1, 2, 4, 8, 16][i % 5],
            50 + (i * 53) % 500,
            time_limit=600,
            priority=["training-high", "training-standard", "best-effort"][i % 3],
            team=f"t{i % 3}",
        )
        for i in range(60)
    ]
    res = sim(jobs, cl, policy)["res"]
    assert res.summary["completed"] == 60
    for r in res.records:
        assert r.end - r.submit >= r.duration
        assert r.run_time >= r.duration - 1e-6


def test_a_preemptor_starts_at_the_instant_its_victim_stops() -> None:
    # "low" holds the node; "high" (a higher class) arrives at 100: one core call stops low, the next, at
    # the same instant, binds high on the freed GPUs, as the live scheduler does on the victim's stop.
    jobs = [J("low", 0, 8, 1000, priority="best-effort"), J("high", 100, 8, 50, priority="training-high")]
    out = sim(jobs, ONE_NODE, "rallypoint")["by"]
    assert (out["high"].start, out["high"].end) == (100, 150)
    assert out["low"].preemptions == 1


def test_a_cut_chain_of_cycles_follows_up_instead_of_waiting_for_an_unrelated_event() -> None:
    # With one core call per instant the preemptor cannot be bound at 100; it must not wait for the next
    # periodic tick (160) or low's end, but start in the follow-up cycle one second later.
    jobs = [J("low", 0, 8, 1000, priority="best-effort"), J("high", 100, 8, 50, priority="training-high")]
    out = sim(jobs, ONE_NODE, "rallypoint", max_cycles_per_instant=1)["by"]
    assert (out["high"].start, out["high"].end) == (101, 151)
