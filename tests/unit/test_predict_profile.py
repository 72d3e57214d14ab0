"""A dry run fitted into the last refresh's forecast (``rallypoint.predict.profile``), when its own run
forward would take too long: what each job holds from when to when, recorded by the refresh's run
(``live.predict_and_forecast``), and the earliest start at which enough nodes stay free for the job's
whole runtime, behind the jobs ahead of it and before those of a lower class."""

from __future__ import annotations

import asyncio
import threading

import msgspec
import pytest
from test_predict_live import T0, busy_cluster, spec

from rallypoint.events import JobSpec, JobSubmitted
from rallypoint.predict import RuntimeEstimator, refresh
from rallypoint.predict.live import PredictedStart, predict, predict_and_forecast, run_forward
from rallypoint.predict.profile import Forecast, Hold, estimate_start
from rallypoint.predict.refresh import DRY_RUN_JOB, Predictor
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.sim.cluster import Cluster, Node
from rallypoint.sim.twin import LiveSide
from rallypoint.state import ClusterState

HOUR = 3600.0


def hold(
    job_id: str, start: float, end: float | None, *gpus: tuple[str, int], rank: int | None = None
) -> Hold:
    """A job's hold; one with a ``rank`` was waiting when the run began."""
    return Hold(job_id=job_id, rank=rank, start=start, end=end, gpus=gpus, waiting=rank is not None)


def forecast(*holds: Hold, nodes: int = 2, horizon_s: float = 7 * 86400.0) -> Forecast:
    return Forecast(
        seq=1, now=T0, horizon_s=horizon_s, nodes={f"n{i}": ("h100", 8) for i in range(nodes)}, holds=holds
    )


def start(f: Forecast, gpus: int, limit_s: float | None, *, per_task: int = 8, ahead: int | None = None,
          types: tuple[str, ...] | None = None) -> float | None:  # fmt: skip
    return estimate_start(
        f, gpus=gpus, gpus_per_task=per_task, gpu_types=types, jobs_ahead=ahead, limit_s=limit_s, now=T0
    )


def test_a_job_starts_when_enough_nodes_are_free_for_all_its_tasks() -> None:
    f = forecast(hold("a", T0 - 50, T0 + 100, ("n0", 8)), hold("b", T0 - 50, T0 + 300, ("n1", 8)))
    assert start(f, 8, 50) == T0 + 100
    assert start(f, 16, 50) == T0 + 300  # two tasks of 8: both nodes
    assert start(f, 4, 50, per_task=4) == T0 + 100
    assert start(f, 24, 50) is None  # more than the cluster: never


def test_a_gap_shorter_than_the_jobs_runtime_is_not_used() -> None:
    waiting = hold("c", T0 + 150, T0 + 400, ("n0", 8), rank=3)
    f = forecast(hold("a", T0 - 50, T0 + 100, ("n0", 8)), hold("b", T0 - 50, T0 + 300, ("n1", 8)), waiting)
    assert start(f, 8, 40) == T0 + 100  # its limit says it ends before the waiting job's start
    assert start(f, 8, 100) == T0 + 300  # not so: the other node once free
    assert start(f, 8, None) == T0 + 300  # without a limit it never goes into a gap
    assert start(f, 8, 100, ahead=4) == T0 + 300  # the waiting job is 4th in the order: ahead of it
    # ordered after it (3 jobs ahead of it, the waiting one 4th): the gap on n0 is its own
    assert start(f, 8, 1000, ahead=3) == T0 + 100


def test_partly_free_nodes_offer_one_slot_per_task_that_fits() -> None:
    f = forecast(hold("a", T0 - 50, T0 + 100, ("n0", 6)), hold("b", T0 - 50, T0 + 300, ("n1", 2)))
    # after the next change (t+100), n0 has 8 free and n1 6: four tasks of 2 plus three fit at once
    assert start(f, 14, 10, per_task=2) == T0 + 100
    assert start(f, 16, 10, per_task=2) == T0 + 300


def test_only_the_nodes_of_an_allowed_gpu_type_count_and_the_horizon_bounds_the_answer() -> None:
    f = forecast(hold("a", T0 - 50, T0 + 100, ("n0", 8)), hold("b", T0 - 50, T0 + 300, ("n1", 8)))
    assert start(f, 8, 50, types=("a100",)) is None
    short = forecast(
        hold("a", T0 - 50, T0 + 100, ("n0", 8)), hold("b", T0 - 50, None, ("n1", 8)), horizon_s=50
    )
    assert start(short, 8, 50) is None


def test_a_forecast_says_how_long_its_run_took_to_reach_a_moment() -> None:
    f = msgspec.structs.replace(forecast(), costs=((T0, 0.25), (T0, 0.1), (T0 + 100, 0.2), (T0 + 900, 0.3)))
    assert f.cost_until(T0 + 100) == 0.25 + 0.1 + 0.2
    assert f.cost_until(T0 + 50) == 0.25 + 0.1
    assert f.cost_until(None) == float("inf")  # never reached: a run forward would not get there


def test_the_refresh_records_what_each_job_holds_from_when_to_when() -> None:
    predictions, p50, p90 = predict_and_forecast(
        busy_cluster(), SchedulingPolicy("fifo"), RuntimeEstimator(), T0 + 60
    )
    held = {h.job_id: h for h in p50.holds}
    assert set(held) == {"short", "long", "gang", "single"}
    # no history: every job runs an hour; the gang takes both nodes when the first two end
    assert (held["short"].start, held["short"].end, held["short"].waiting) == (T0, T0 + HOUR, False)
    assert (held["gang"].start, held["gang"].end, held["gang"].waiting) == (T0 + HOUR, T0 + 2 * HOUR, True)
    assert sum(n for _, n in held["gang"].gpus) == 16 and held["single"].start == T0 + 2 * HOUR
    assert p90 == p50 and predictions.jobs["single"].p50 == T0 + 2 * HOUR
    assert set(p50.nodes) == {"n0", "n1"}
    # its set-up and each cycle, at their moments: now, then the ends at one and two hours
    assert [t for t, _ in p50.costs] == [T0 + 60, T0 + 60, T0 + HOUR, T0 + 2 * HOUR]
    assert all(seconds > 0 for _, seconds in p50.costs)
    # the first cycle's order: the gang first, the single job behind it; the running jobs have none
    assert (held["gang"].rank, held["single"].rank, held["short"].rank) == (0, 1, None)


def test_a_dry_run_past_its_exact_budget_is_fitted_into_the_refreshs_forecast() -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    # no time for its own run forward (``dry_run_exact_s=0``): the last refresh's forecast answers
    predictor = Predictor(lambda: state, no_settings, dry_run_exact_s=0.0)

    async def asked() -> PredictedStart:
        await predictor.refresh(now=T0 + 60)
        return await predictor.dry_run(spec("next", 8), now=T0 + 70)

    estimated = asyncio.run(asked())
    assert estimated.basis == "forecast" and estimated.forecast_seq == state.last_seq
    assert estimated.forecast_at == T0 + 60 and predictor.dry_runs_estimated == 1
    # here the forecast's answer is the run forward's: the node the single job leaves free
    assert estimated.p50 == exact_start(state, spec("next", 8), T0 + 70) == T0 + 2 * HOUR


def test_a_dry_run_within_its_exact_budget_is_the_run_forwards_and_a_fraction_is_never_fitted() -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)

    async def asked() -> PredictedStart:
        await predictor.refresh(now=T0 + 60)
        return await predictor.dry_run(spec("next", 8), now=T0 + 70)

    assert asyncio.run(asked()).basis == "run" and predictor.dry_runs_estimated == 0
    fraction = msgspec.structs.replace(spec("notebook", 1), gpu_milli=250)
    assert predictor.forecasts is not None
    assert predictor._estimate(predictor.forecasts, fraction, T0 + 70, None) is None


def exact_start(state: ClusterState, job: JobSpec, at: float) -> float | None:
    """The dry run's start as its own run forward finds it."""
    fork = ClusterState.decode(state.encode())
    fork.apply(fork.last_seq + 1, JobSubmitted(job_id=DRY_RUN_JOB, spec=job, submitted_at=at))
    found = predict(fork, SchedulingPolicy(), RuntimeEstimator(), at, only=DRY_RUN_JOB, advance_clock=False)
    return found.jobs[DRY_RUN_JOB].p50


def test_a_refresh_with_nothing_waiting_makes_no_fork_and_no_forecast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    side = LiveSide(Cluster(nodes=(Node(id="n0", rack="r0", gpus=8),)), SchedulingPolicy("fifo"))
    side.append(JobSubmitted(job_id="only", spec=spec("only", 8), submitted_at=T0))
    side.carry_out(side.cycle(T0).writes, T0)
    assert not side.state.pending_jobs()

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing waits: nothing to run forward")

    monkeypatch.setattr(refresh, "predict_and_forecast", never)

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: side.state, no_settings)
    predictions = asyncio.run(predictor.refresh(now=T0 + 60))
    assert predictions.jobs == {} and predictions.seq == side.state.last_seq and predictor.forecasts is None


def test_a_refresh_makes_the_next_dry_runs_fork_ahead_only_while_dry_runs_are_asked() -> None:
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)

    async def refresh_dry_run_refresh() -> tuple[bool, bool]:
        await predictor.refresh(now=T0 + 60)
        quiet = predictor._preparing is None  # nobody asked for a dry run: no fork made ahead
        await predictor.dry_run(spec("next", 8), now=T0 + 70)
        await predictor.preparing()
        predictor._ready = None
        await predictor.refresh(now=T0 + 80)
        await predictor.preparing()
        return quiet, predictor._ready is not None

    quiet, made = asyncio.run(refresh_dry_run_refresh())
    assert quiet and made


def test_a_refresh_waits_between_its_cycles_while_a_dry_run_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(refresh, "GIVE_WAY_S", 60.0)  # longer than the test: it waits until the gate opens
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)
    gate = predictor._dry_gate = _PausingGate()

    async def refresh_held() -> bool:
        gate.clear()  # as a dry run under way does
        refreshing = asyncio.create_task(predictor.refresh(now=T0 + 60))
        assert await asyncio.to_thread(gate.reached.wait, 30)
        held = not refreshing.done()
        gate.set()  # the dry run answered
        await asyncio.wait_for(refreshing, 30)
        return held

    assert asyncio.run(refresh_held()) and predictor.forecasts is not None


class _PausingGate(threading.Event):
    """The dry-run gate, noting (``reached``) when a run forward came to wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.set()
        self.reached = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.reached.set()
        return super().wait(timeout)


def test_a_run_forward_pauses_before_its_set_up_and_each_of_its_cycles() -> None:
    paused: list[int] = []
    policy = SchedulingPolicy("fifo")
    run = run_forward(busy_cluster(), policy, lambda job: HOUR, T0 + 60, pause=lambda: paused.append(1))
    assert len(paused) == 1 + run.cycles and run.cycles > 1  # before its set-up, then before each cycle


def test_dry_runs_one_after_another_never_stop_a_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refresh, "GIVE_WAY_S", 0.01)
    state = busy_cluster()

    async def no_settings() -> None:
        return None

    predictor = Predictor(lambda: state, no_settings)
    predictor._dry_gate.clear()  # a dry run under way the whole time
    predictions = asyncio.run(asyncio.wait_for(predictor.refresh(now=T0 + 60), 60))
    assert set(predictions.jobs) == {"gang", "single"}
