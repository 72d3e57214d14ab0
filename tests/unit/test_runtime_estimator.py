"""The runtime estimator (rallypoint.predict.runtimes): quantiles from the most specific history with
enough ended jobs, capped at the time limit, conditional on what a running job has already run, and a
clock that refuses to know the future."""

from __future__ import annotations

import pytest

from rallypoint.predict.runtimes import JobFeatures, RuntimeEstimator, gpu_class, quantile

A1 = JobFeatures(team="a", gpus=1, time_limit_s=3600.0)


def fed(runs: list[tuple[JobFeatures, float]], **kw: int) -> RuntimeEstimator:
    est = RuntimeEstimator(**kw)
    for t, (f, r) in enumerate(runs):
        est.observe(float(t), f, r)
    return est


def test_quantiles_are_ordered_and_capped_at_the_time_limit() -> None:
    est = fed([(A1, r) for r in (100.0, 200.0, 300.0, 5000.0, 400.0)])
    e = est.estimate(A1, 10.0)
    assert e.key == "team+gpus+limit"
    assert (e.p50, e.p90) == (300.0, 3600.0)  # P90 is the 5,000 s run, capped at the 1 h limit
    assert e.p50 <= e.p90


def test_the_most_specific_key_with_enough_history_answers() -> None:
    named = JobFeatures(team="a", gpus=1, user="u", name="bert", time_limit_s=3600.0)
    est = fed([(A1, 50.0), (A1, 60.0), (named, 900.0), (named, 1000.0)])
    assert est.estimate(named, 10.0).p50 == 900.0
    assert est.estimate(named, 10.0).key == "user+name"
    other = JobFeatures(team="a", gpus=1, user="u", name="gpt", time_limit_s=3600.0)
    assert est.estimate(other, 10.0).key == "team+gpus+limit"  # no gpt history: the team's 1-GPU 1 h jobs
    stranger = JobFeatures(team="b", gpus=64)
    assert est.estimate(stranger, 10.0).key == "all"


def test_no_history_answers_the_time_limit() -> None:
    e = RuntimeEstimator().estimate(A1, 0.0)
    assert (e.p50, e.p90, e.key) == (3600.0, 3600.0, "none")


def test_a_running_job_of_no_history_is_expected_to_run_what_it_was_at_submit() -> None:
    """Not half as long again as its first seconds: a job 3 s in would be expected to end at 4.5 s."""
    unlimited = JobFeatures(team="a", gpus=1)
    assert RuntimeEstimator().estimate(unlimited, 0.0, elapsed_s=3.0).p50 == 3600.0  # one hour, no limit
    assert RuntimeEstimator().estimate(A1, 0.0, elapsed_s=3.0).p50 == 3600.0  # its limit
    assert RuntimeEstimator().estimate(unlimited, 0.0, elapsed_s=7200.0).p50 == 10800.0  # past the hour


def test_a_running_job_is_answered_from_longer_runs_only() -> None:
    est = fed([(A1, r) for r in (100.0, 200.0, 300.0, 2000.0, 3000.0)])
    e = est.estimate(A1, 10.0, elapsed_s=500.0)
    assert (e.p50, e.p90) == (2000.0, 3000.0)
    past_all = est.estimate(A1, 10.0, elapsed_s=3500.0)  # longer than anything seen, inside its limit
    assert 3500.0 < past_all.p50 <= 3600.0


def test_the_clock_refuses_what_ended_after_the_moment_asked() -> None:
    est = RuntimeEstimator()
    est.observe(100.0, A1, 50.0)
    with pytest.raises(ValueError, match="already saw an end at 100"):
        est.estimate(A1, 99.0)  # a job that ended at 100 is unknown at 99
    est.estimate(A1, 100.0)  # what ended at the instant itself is known
    est.estimate(A1, 200.0)
    with pytest.raises(ValueError, match="older than the estimator's clock"):
        est.observe(150.0, A1, 50.0)  # an answer for 200 was already given without it


def test_memory_is_bounded_per_key_and_answers_are_deterministic() -> None:
    runs = [(A1, float(100 + i)) for i in range(100)]
    one, two = fed(runs, window=8, min_samples=2), fed(runs, window=8, min_samples=2)
    assert all(len(h) <= 8 for h in one._history.values())
    assert one.estimate(A1, 1000.0) == two.estimate(A1, 1000.0)
    assert one.estimate(A1, 1000.0).p50 == quantile([float(100 + i) for i in range(92, 100)], 0.5)


def test_gpu_classes_and_bad_settings() -> None:
    assert [gpu_class(g) for g in (1, 2, 3, 4, 5, 8, 9, 16, 32)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    with pytest.raises(ValueError):
        RuntimeEstimator(window=2, min_samples=3)
    with pytest.raises(ValueError, match="runtime_s"):
        RuntimeEstimator().observe(0.0, A1, 0.0)


def test_a_limit_no_ended_job_had_is_answered_from_the_share_of_their_limits_like_jobs_used() -> None:
    # the team's 1-GPU jobs asked for 1 h and used about half of it; a first 4 h job is expected to use
    # about half of its 4 h, not the half hour its team's runtimes say whatever their limits
    est = fed([(A1, r) for r in (1500.0, 1800.0, 2100.0)])
    four = JobFeatures(team="a", gpus=1, time_limit_s=4 * 3600.0)
    e = est.estimate(four, 10.0)
    assert e.key == "team+gpus+share"
    assert (e.p50, e.p90) == pytest.approx((4 * 1800.0, 4 * 2100.0))
    # a job running past its limit counts as having used all of it; jobs without a limit have no share:
    # their runtimes answer
    late = fed([(A1, 7200.0), (A1, 7200.0)])
    assert late.estimate(four, 10.0).p50 == 4 * 3600.0
    unlimited = fed([(JobFeatures(team="a", gpus=1), 100.0)] * 2).estimate(four, 10.0)
    assert (unlimited.key, unlimited.p50) == ("team+gpus", 100.0)
    # a team that never gave a limit to any job: the share of everyone else's
    stranger = JobFeatures(team="b", gpus=8, time_limit_s=600.0)
    assert est.estimate(stranger, 10.0).key == "share"
    assert est.estimate(stranger, 10.0).p50 == pytest.approx(600.0 * 1800.0 / 3600.0)
