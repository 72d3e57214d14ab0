"""The fluid reference (sim/fluid.py) on hand-computed scenarios."""

from __future__ import annotations

import random

import pytest

from rallypoint.sim.fluid import fluid_reference
from rallypoint.sim.workload import Job


def J(id: str, submit: float, gpus: int, dur: float, team: str = "t") -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=dur, team=team)


def test_a_job_with_less_work_left_preempts_for_free() -> None:
    # a (2 GPUs x 10 s) starts at 0. At 1 b arrives with 1 x 2 = 2 GPU-s left against a's 2 x 9 = 18: b runs
    # 1..3 on one GPU, and a, which needs both, resumes at 3 with nothing lost and ends at 12.
    res = fluid_reference([J("a", 0, 2, 10), J("b", 1, 1, 2)], gpus=2)
    assert res.jct == {"a": 12.0, "b": 2.0}
    assert res.avg_jct == 7.0


def test_a_gang_that_does_not_fit_is_skipped_for_one_that_does() -> None:
    # ranked a (1 x 5 = 5), w (3 x 4 = 12), c (2 x 20 = 40) on 3 GPUs: a runs, w (3) does not fit beside it,
    # c (2) does. At 5 a ends and w ranks ahead of c (12 < 2 x 15 = 30): w runs 5..9 alone, c resumes at 9
    # with 15 s left and ends at 24.
    res = fluid_reference([J("a", 0, 1, 5), J("w", 0, 3, 4), J("c", 0, 2, 20)], gpus=3)
    assert res.jct == {"a": 5.0, "w": 9.0, "c": 24.0}


def test_the_guarantee_puts_a_team_inside_its_nominal_first() -> None:
    jobs = [J("x", 0, 1, 100, "x"), J("y1", 0, 1, 1, "y"), J("y2", 0, 1, 1, "y"), J("y3", 0, 1, 1, "y")]
    # without it: y1, y2 at 0..1, y3 and x at 1, y3 done at 2, x at 101
    free = fluid_reference(jobs, gpus=2)
    assert free.jct == {"x": 101.0, "y1": 1.0, "y2": 1.0, "y3": 2.0}
    # nominal 1 each: team x, which has work waiting, holds its one GPU from 0; team y runs one at a time
    kept = fluid_reference(jobs, gpus=2, nominal={"x": 1, "y": 1})
    assert kept.jct == {"x": 100.0, "y1": 1.0, "y2": 2.0, "y3": 3.0}
    assert kept.avg_jct == 26.5 > free.avg_jct == 26.25


def test_a_team_borrows_what_the_others_leave_idle() -> None:
    # team x owns both GPUs but has nothing to run until 10: y uses both, then x takes its share back
    jobs = [J("y1", 0, 1, 20, "y"), J("y2", 0, 1, 20, "y"), J("x", 10, 2, 5, "x")]
    res = fluid_reference(jobs, gpus=2, nominal={"x": 2, "y": 0})
    assert res.jct == {"y1": 25.0, "y2": 25.0, "x": 5.0}


def test_idle_time_between_arrivals_is_skipped() -> None:
    res = fluid_reference([J("a", 100, 1, 10), J("b", 500, 1, 10)], gpus=1)
    assert res.jct == {"a": 10.0, "b": 10.0}


def test_a_job_wider_than_the_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="more than 4 GPUs"):
        fluid_reference([J("a", 0, 8, 10)], gpus=4)


def test_a_team_that_owns_the_whole_pool_is_untouched_by_the_others() -> None:
    # team x's nominal is every GPU: its jobs go first, so other teams' load cannot change x's JCTs
    rng = random.Random(7)
    x = [
        J(f"x{i}", rng.uniform(0, 500), rng.choice((1, 2, 4, 8)), rng.uniform(1, 300), "x") for i in range(40)
    ]
    y = [J(f"y{i}", rng.uniform(0, 500), rng.choice((1, 2, 4)), rng.uniform(1, 300), "y") for i in range(60)]
    alone = fluid_reference(x, gpus=8).jct
    shared = fluid_reference(x + y, gpus=8, nominal={"x": 8, "y": 0}).jct
    assert {k: shared[k] for k in alone} == pytest.approx(alone)
    # without the guarantee y's shorter jobs do get ahead of some of x's
    free = fluid_reference(x + y, gpus=8).jct
    assert sum(free[k] for k in alone) > sum(alone.values())
