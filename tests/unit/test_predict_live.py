"""The live predictor's core (``rallypoint.predict.live``): the fold forked and run forward by the cycle.

A two-node cluster is driven through the twin's live side (the leader's cycle, carried out at once), so
the fold is one the services would hold. Then the forward run must start each waiting job where the
scheduler would if every job ran as long as the estimator says, leave the fold untouched, and answer
nothing for what it cannot reach.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from rallypoint.events import JobCompleted, JobSpec, JobSubmitted
from rallypoint.predict import RuntimeEstimator, live, refresh
from rallypoint.predict.calibration import WaitCalibrator
from rallypoint.predict.live import (
    OutOfTime,
    PredictedStart,
    Predictions,
    features_of,
    learn,
    predict,
    run_forward,
)
from rallypoint.predict.profile import Forecast
from rallypoint.predict.refresh import Predictor
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.writes import Write
from rallypoint.sim.cluster import Cluster, Node
from rallypoint.sim.twin import LiveSide
from rallypoint.state import ACTIVE, ClusterState, JobView

T0 = 1_800_000_000.0


def spec(name: str, gpus: int, *, limit: int | None = None, priority: str = "training-standard") -> JobSpec:
    return JobSpec(
        name=name,
        team="vision",
        gpus=gpus,
        gpus_per_task=min(gpus, 8),
        ranks_per_task=1,
        command=("python", f"{name}.py"),
        priority=priority,
        time_limit_s=limit,
    )


def cluster_side(nodes: int = 2) -> LiveSide:
    cluster = Cluster(nodes=tuple(Node(id=f"n{i}", rack="r0", gpus=8) for i in range(nodes)))
    return LiveSide(cluster, SchedulingPolicy("fifo"))


def submit(side: LiveSide, job_id: str, job: JobSpec, at: float) -> None:
    side.append(JobSubmitted(job_id=job_id, spec=job, submitted_at=at))


def run_cycle(side: LiveSide, now: float) -> None:
    side.carry_out(side.cycle(now).writes, now)


def taught(runtimes: dict[str, float]) -> RuntimeEstimator:
    """An estimator that has seen two past runs of each name, each ``runtimes[name]`` long."""
    side = cluster_side(nodes=1)
    t = T0 - 200 * 86400.0
    for name, seconds in runtimes.items():
        for i in range(2):
            job_id = f"past-{name}-{i}"
            submit(side, job_id, spec(name, 8), t)
            run_cycle(side, t)
            t += seconds
            side.append(JobCompleted(job_id=job_id, attempt=1, at=t))
    estimator = RuntimeEstimator()
    assert learn(estimator, side.state.jobs.values()) == 2 * len(runtimes)
    return estimator


def busy_cluster() -> ClusterState:
    """Both nodes busy since T0 (a 1 h job on each), then a 16-GPU gang and an 8-GPU job waiting."""
    side = cluster_side()
    submit(side, "short", spec("short", 8), T0)
    submit(side, "long", spec("long", 8), T0)
    run_cycle(side, T0)
    submit(side, "gang", spec("gang", 16), T0 + 10)
    submit(side, "single", spec("single", 8), T0 + 20)
    run_cycle(side, T0 + 20)
    assert {j.job_id for j in side.state.pending_jobs()} == {"gang", "single"}
    return side.state


def test_waiting_jobs_start_when_the_estimated_ends_free_their_gpus_in_the_policys_order() -> None:
    estimator = taught({"short": 600.0, "long": 3600.0, "gang": 1800.0, "single": 300.0})
    state = busy_cluster()
    before = state.hash()
    predictions = predict(state, SchedulingPolicy("fifo"), estimator, T0 + 60)
    assert state.hash() == before, "the live fold is never touched: each run forks its own"
    # FIFO: the gang (first in line) needs both nodes, so it starts when the long job ends; the single
    # job, behind it, waits for the gang (strict order), then starts when the gang's end frees a node
    assert predictions.jobs["gang"].p50 == pytest.approx(T0 + 3600)
    assert predictions.jobs["single"].p50 == pytest.approx(T0 + 3600 + 1800)
    assert predictions.seq == state.last_seq and predictions.now == T0 + 60


def test_the_p90_start_is_no_earlier_than_the_p50_start() -> None:
    estimator = RuntimeEstimator()
    side = cluster_side(nodes=1)
    t = T0 - 200 * 86400.0
    for i, seconds in enumerate((600.0, 600.0, 600.0, 600.0, 3000.0)):  # mostly 10 min, once 50
        submit(side, f"past-{i}", spec("short", 8), t)
        run_cycle(side, t)
        t += seconds
        side.append(JobCompleted(job_id=f"past-{i}", attempt=1, at=t))
    learn(estimator, side.state.jobs.values())
    state = busy_cluster()
    predictions = predict(state, SchedulingPolicy("fifo"), estimator, T0 + 60)
    for job_id, start in predictions.jobs.items():
        assert start.p50 is not None and start.p90 is not None, job_id
        assert start.p90 >= start.p50, job_id


def test_a_job_that_cannot_start_within_the_horizon_gets_no_prediction() -> None:
    estimator = taught({"short": 600.0, "long": 30 * 86400.0, "gang": 60.0, "single": 60.0})
    predictions = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60, horizon_s=86400.0)
    assert predictions.jobs["gang"].p50 is None  # the long job holds a node for 30 days


def test_a_running_job_past_its_estimate_is_expected_to_run_on_not_to_have_ended() -> None:
    estimator = taught({"short": 600.0, "long": 600.0, "gang": 60.0, "single": 60.0})
    now = T0 + 7200  # both running jobs are past every runtime seen
    run = run_forward(busy_cluster(), SchedulingPolicy("fifo"), _p50(estimator, now), now)
    assert run.starts["gang"] > now


def test_a_forward_run_is_deterministic() -> None:
    estimator = taught({"short": 600.0, "long": 3600.0, "gang": 1800.0, "single": 300.0})
    first = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60)
    again = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60)
    assert first == again


def test_a_dry_runs_forward_run_stops_at_its_jobs_start_with_the_full_runs_start() -> None:
    estimator = taught({"short": 600.0, "long": 3600.0, "gang": 1800.0, "single": 300.0})
    runtime = _p50(estimator, T0 + 60)
    full = run_forward(busy_cluster(), SchedulingPolicy("fifo"), runtime, T0 + 60)
    early = run_forward(busy_cluster(), SchedulingPolicy("fifo"), runtime, T0 + 60, until="gang")
    # FIFO: the gang starts when the long job ends, the single job only when the gang ends after it
    assert early.starts["gang"] == full.starts["gang"] == pytest.approx(T0 + 3600)
    assert "single" in full.starts and "single" not in early.starts
    assert early.cycles < full.cycles
    # both forks (P50 and P90) stop at it, and the answer names it alone, as the full answer has it
    whole = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60)
    alone = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60, only="gang")
    assert alone.jobs == {"gang": whole.jobs["gang"]}
    # a dry run gives its fork away: the P90 run uses it, for the same answer
    given = predict(busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60, only="gang", consume=True)
    assert given == alone


def test_a_dry_run_for_a_job_that_never_starts_within_the_horizon_stops_there() -> None:
    estimator = taught({"short": 600.0, "long": 30 * 86400.0, "gang": 60.0, "single": 60.0})
    runtime = _p50(estimator, T0 + 60)
    run = run_forward(
        busy_cluster(), SchedulingPolicy("fifo"), runtime, T0 + 60, horizon_s=86400, until="gang"
    )
    assert "gang" not in run.starts and run.cycles < 5
    alone = predict(
        busy_cluster(), SchedulingPolicy("fifo"), estimator, T0 + 60, horizon_s=86400.0, only="gang"
    )
    assert alone.jobs["gang"].p50 is None and alone.jobs["gang"].p90 is None


def _p50(estimator: RuntimeEstimator, now: float) -> Callable[[JobView], float]:
    return lambda job: estimator.estimate(features_of(job), now, now - (job.started_at or now)).p50


def test_a_dry_run_answers_beside_a_refresh_under_way_and_leaves_its_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)
    release = threading.Event()
    real = refresh.predict_and_forecast

    def refresh_held_up(*args: Any, **kwargs: Any) -> tuple[Predictions, Forecast, Forecast]:
        assert release.wait(10)  # the refresh's run: held until the dry run answered
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "predict_and_forecast", refresh_held_up)

    async def dry_run_during_refresh() -> tuple[PredictedStart, Predictions]:
        refreshing = asyncio.create_task(predictor.refresh(now=T0 + 60))
        await asyncio.sleep(0.05)  # the refresh holds its lock, its run under way
        start = await asyncio.wait_for(predictor.dry_run(spec("next", 8), now=T0 + 70), 10)
        assert not refreshing.done()
        release.set()
        return start, await refreshing

    start, predictions = asyncio.run(dry_run_during_refresh())
    assert start.p50 is not None and start.p50 > T0 + 70
    # the dry run asked the estimator about a later moment without moving its clock: the refresh, which
    # asks about an earlier one, still answers
    assert predictions.now == T0 + 60 and set(predictions.jobs) == {"gang", "single"}


def test_a_dry_run_not_answered_within_its_budget_stops_and_says_so() -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    with pytest.raises(OutOfTime):  # its run forward stops instead of running on for nobody
        asyncio.run(
            Predictor(lambda: state, no_settings, dry_run_budget_s=0.0).dry_run(spec("next", 8), T0 + 70)
        )
    answered = asyncio.run(Predictor(lambda: state, no_settings).dry_run(spec("next", 8), T0 + 70))
    assert answered.p50 is not None


class _FullCycle(live.ForwardRun):
    """The run forward with the twin's whole cycle (``LiveSide.cycle``: the audit, the pending reasons
    written): what ``ForwardRun._decide`` leaves out must change no start."""

    def _decide(self, now: float) -> list[Write]:
        return self.side.cycle(now).writes


def crowded_cluster() -> ClusterState:
    """``busy_cluster`` under the rallypoint policy with more waiting: a job larger than the cluster
    (rejected by the run's first cycle), a high-priority job and small ones behind the gang."""
    state = busy_cluster()
    side = LiveSide.over(state, SchedulingPolicy("rallypoint"))
    submit(side, "huge", spec("huge", 64), T0 + 30)
    submit(side, "urgent", spec("urgent", 8, priority="training-high"), T0 + 40)
    for i in range(3):
        submit(side, f"small{i}", spec(f"small{i}", 8), T0 + 50 + i)
    return side.state


@pytest.mark.parametrize("policy", ["fifo", "rallypoint"])
def test_the_forward_run_starts_every_job_where_the_twins_whole_cycle_does(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    estimator = taught({"short": 600.0, "long": 3600.0, "gang": 1800.0, "single": 300.0, "urgent": 900.0})
    lean = predict(crowded_cluster(), SchedulingPolicy(policy), estimator, T0 + 60)
    monkeypatch.setattr(live, "ForwardRun", _FullCycle)
    whole = predict(crowded_cluster(), SchedulingPolicy(policy), estimator, T0 + 60)
    assert lean == whole
    assert "huge" not in lean.jobs or lean.jobs["huge"].p50 is None  # rejected: it never starts
    assert sum(start.p50 is not None for start in lean.jobs.values()) >= 3


def test_the_p90_run_is_left_out_only_where_it_would_repeat_the_p50_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[str] = []
    real = live.run_forward

    def counted(*args: Any, **kwargs: Any) -> live.ForwardRun:
        runs.append(args[2].quantile)
        return real(*args, **kwargs)

    monkeypatch.setattr(live, "run_forward", counted)
    policy = SchedulingPolicy("rallypoint")
    # no history: every runtime is the time limit (or one hour), P50 = P90: one run answers both
    first = predict(crowded_cluster(), policy, RuntimeEstimator(), T0 + 60)
    assert runs == ["p50"]
    runs.clear()
    # a history of 10 min runs and one of 50: the P90 differs, so the P90 run is made
    estimator = RuntimeEstimator()
    for i, seconds in enumerate((600.0, 600.0, 600.0, 600.0, 3000.0)):
        features = features_of(crowded_cluster().jobs["small0"])
        estimator.observe(T0 - 86400 + i * 3600, features, seconds)
    second = predict(crowded_cluster(), policy, estimator, T0 + 60)
    assert runs == ["p50", "p90"]
    # each answer is what two separate runs give
    for estimator_, answer in ((RuntimeEstimator(), first), (estimator, second)):
        for job_id, start in answer.jobs.items():
            p50 = real(crowded_cluster(), policy, _quantile(estimator_, "p50"), T0 + 60).starts.get(job_id)
            p90 = real(crowded_cluster(), policy, _quantile(estimator_, "p90"), T0 + 60).starts.get(job_id)
            assert (start.p50, start.p90) == (p50, None if p90 is None else max(p90, p50 or p90)), job_id


def _quantile(estimator: RuntimeEstimator, quantile: str) -> Callable[[JobView], float]:
    now = T0 + 60

    def runtime(job: JobView) -> float:
        elapsed = job.run_s + (now - job.started_at if job.state in ACTIVE and job.started_at else 0.0)
        estimate = estimator.estimate(features_of(job), now, max(0.0, elapsed))
        return max(1.0, getattr(estimate, quantile) - job.run_s)

    return runtime


def test_a_dry_run_from_the_fork_made_ahead_predicts_what_a_fork_made_then_does() -> None:
    state = crowded_cluster()
    estimator = taught({"short": 600.0, "long": 3600.0, "gang": 1800.0, "single": 300.0})

    async def no_settings() -> None:
        return None

    async def both() -> tuple[PredictedStart, PredictedStart, bool]:
        ahead = Predictor(lambda: state, no_settings)
        ahead.estimator = estimator
        ahead.prepare(SchedulingPolicy(), T0 + 60)
        await ahead.preparing()
        ready = ahead._ready is not None
        start = await ahead.dry_run(spec("next", 8), now=T0 + 70)
        assert ahead._ready is None or ahead._preparing is not None  # used up, the next one under way
        await ahead.preparing()
        cold = Predictor(lambda: state, no_settings)
        cold.estimator = estimator
        return start, await cold.dry_run(spec("next", 8), now=T0 + 70), ready

    ahead, cold, ready = asyncio.run(both())
    assert ready and ahead == cold and ahead.p50 is not None
    # the fold moved: the fork made ahead is stale and not used
    predictor = Predictor(lambda: state, no_settings)
    asyncio.run(_prepare_then_move(predictor, state))
    assert predictor._ready is None


async def _prepare_then_move(predictor: Predictor, state: ClusterState) -> None:
    predictor.prepare(SchedulingPolicy(), T0 + 60)
    await predictor.preparing()
    state.apply(state.last_seq + 1, JobSubmitted(job_id="later", spec=spec("later", 8), submitted_at=T0 + 65))
    assert predictor._take_ready(SchedulingPolicy()) is None


def test_the_predictor_calibrates_its_p90_on_the_jobs_it_predicted_that_started() -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)
    predictor.calibrator = WaitCalibrator(min_resolved=1)
    first = asyncio.run(predictor.refresh(now=T0 + 60))
    assert first.jobs["gang"].p90 == pytest.approx(T0 + 3600)  # no history: both 1 h jobs end at T0 + 1 h
    # they ran 2 h: the gang starts at T0 + 2 h, twice as late as its P90 run said (from T0 + 60)
    side = LiveSide.over(state, SchedulingPolicy())
    for job_id in ("short", "long"):
        side.append(JobCompleted(job_id=job_id, attempt=1, at=T0 + 7200))
    run_cycle(side, T0 + 7200)
    assert state.jobs["gang"].started_at == T0 + 7200
    predictor.observe(None)
    assert predictor.calibrator.resolved == 1
    # the next refresh shows the single job's P90 run's wait scaled by that factor
    now = T0 + 7300
    fork = ClusterState.decode(state.encode())
    raw = predict(fork, SchedulingPolicy(), predictor.estimator, now, advance_clock=False)
    shown = asyncio.run(predictor.refresh(now=now)).jobs["single"]
    assert predictor.calibrator.factor() == pytest.approx((7200 - 60) / (3600 - 60))
    expected = raw.jobs["single"]
    assert expected.p90 is not None and shown.p50 == expected.p50
    assert shown.p90 == pytest.approx(now + predictor.calibrator.factor() * (expected.p90 - now))


def test_a_job_no_cycle_has_seen_waits_for_no_prediction_until_its_grace_ends() -> None:
    side = cluster_side(nodes=1)
    submit(side, "big", spec("big", 8), T0)
    run_cycle(side, T0)  # bound: the node is full
    submit(side, "fresh", spec("fresh", 8), T0 + 1)
    # submitted a second ago, no cycle has looked at it: most such jobs are bound by the next one
    assert not refresh.waits_for_prediction(side.state, T0 + 2)
    # unanswered past the grace (no leader, a stalled cycle): it waits like any other
    assert refresh.waits_for_prediction(side.state, T0 + 1 + refresh.UNSEEN_GRACE_S)
    run_cycle(side, T0 + 2)  # the cycle leaves it waiting, in its queue
    assert side.state.jobs["fresh"].queue is not None
    assert refresh.waits_for_prediction(side.state, T0 + 2)


def test_a_refresh_makes_no_fork_while_only_unseen_jobs_wait() -> None:
    side = cluster_side(nodes=1)
    submit(side, "fresh", spec("fresh", 8), T0)

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: side.state, no_settings)
    predictions = asyncio.run(predictor.refresh(now=T0 + 1))
    assert predictions.jobs == {} and predictor.forecasts is None
    later = asyncio.run(predictor.refresh(now=T0 + refresh.UNSEEN_GRACE_S))
    assert set(later.jobs) == {"fresh"} and predictor.forecasts is not None
