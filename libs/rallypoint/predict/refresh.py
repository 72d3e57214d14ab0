"""The predictor service's loop: learn from what ended, refresh every waiting job's predicted start.

Each refresh (every ``interval_s``, when the log moved): the jobs the fold touched are looked at; those
that completed teach the estimator their runtimes and score the first prediction made for them, those that
started score their predicted start (``tracking``) and teach the P90's calibration
(``calibration.WaitCalibrator``: the P90 shown is the P90 run's, its wait scaled by how late the jobs
predicted so far started against theirs); then the scheduler's settings of its current epoch
(``SchedulerSettings``, read from the log: the same policy, queues and priority classes the leader
decides with) and a copy of the fold go to ``live.predict`` in a worker thread, so answering queries never
waits for a run. The latest answer is kept encoded, ready for ``q.predictor.starts``. A dry run
(``q.predictor.dryrun``) runs its own fork forward in another thread, beside a refresh under way.

A dry run's fork is made before it is asked for: after each refresh and each dry run, a ``ReadyFork`` of
the fold as it is then (decoded, the scheduler's model built on it) is prepared off the event loop. A
dry run takes it when the fold has not moved since and the leader's settings are the same, and so starts
its run forward at once; else it forks the fold as it is (the seconds of a decode and a model build on a
large fold). Either way its prediction is the full run's from the fold it saw.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import msgspec

from rallypoint.core.types import PriorityClass, Queue
from rallypoint.events import JobSpec, JobSubmitted, SchedulerSettings
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

from .calibration import WaitCalibrator
from .live import (
    HORIZON_S,
    MAX_CYCLES,
    OutOfTime,
    PredictedStart,
    Predictions,
    ReadyFork,
    learn,
    predict,
    predict_and_forecast,
    runtime_of,
    spec_features,
)
from .profile import Forecast, estimate_start
from .runtimes import RuntimeEstimator
from .tracking import Accuracy, AccuracyTracker

__all__ = [
    "DRY_RUN_BUDGET_S",
    "DRY_RUN_DEMAND_S",
    "DRY_RUN_EXACT_S",
    "DRY_RUN_JOB",
    "JOBS_AHEAD_HEADER",
    "Answer",
    "Predictor",
    "Settings",
    "policy_of",
]

#: The id a dry run's job takes in the fork (no real id has this form: they are ``j-`` and hex).
DRY_RUN_JOB = "dry-run"
#: Seconds a dry run's prediction may take from its question (the API waits 2 s for it): past them its run
#: forward stops (``live.OutOfTime``) instead of running on for an answer nobody waits for any more, in
#: the way of the next dry run.
DRY_RUN_BUDGET_S = 1.5
#: Once a refresh made a forecast, a dry run is first fitted into it (``profile.estimate_start``: ~0.1 s at
#: 12,500 nodes); its own run forward is made too only where the refresh's run took at most this long to
#: reach the estimated start (``Forecast.cost_until``), and the estimate answers if it is not done within
#: this long either: a dry run whose job waits behind hundreds of ends still answers within a second.
DRY_RUN_EXACT_S = 0.5
#: The header of a dry run's question (``q.predictor.dryrun``) carrying the job's place in the policy's
#: order at the API's cycle: the jobs ahead of it in a prediction fitted into the forecast.
JOBS_AHEAD_HEADER = "Rally-Jobs-Ahead"
#: The longest a refresh's run forward waits at one point for a dry run to be answered (``_dry_gate``).
GIVE_WAY_S = 1.0
#: A refresh makes the next dry run's fork ahead only while dry runs are being asked: within this long of
#: the last one (the first after a quiet spell forks the fold itself, then the next ones are ready).
DRY_RUN_DEMAND_S = 600.0

_log = logging.getLogger("rallypoint.predictor")


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """What ``q.predictor.starts`` answers: the latest predictions (None before the first refresh), the
    policy they were made under, how long the refresh took, and the accuracy measured so far."""

    predictions: Predictions | None
    policy: str
    refresh_s: float
    accuracy: Accuracy
    shares: dict[str, float | None]


def policy_of(settings: SchedulerSettings | None) -> SchedulingPolicy:
    """The leader's recorded policy, queues and priority classes; the defaults before any leader ran (or
    for settings this version cannot read)."""
    if settings is None:
        return SchedulingPolicy()
    try:
        queues = msgspec.convert(settings.queues, tuple[Queue, ...])
        classes = msgspec.convert(settings.priority_classes, tuple[PriorityClass, ...])
        return SchedulingPolicy(settings.policy, queues=queues, priority_classes=classes)
    except (KeyError, msgspec.ValidationError):
        return SchedulingPolicy()


Settings = Callable[[], Awaitable[SchedulerSettings | None]]


#: How long a job no scheduling cycle has looked at yet may wait before it counts as waiting anyway (no
#: leader, a stalled cycle): a refresh then predicts it like any other.
UNSEEN_GRACE_S = 10.0


def waits_for_prediction(state: ClusterState, now: float) -> bool:
    """Whether a job waits that a prediction is for: one the scheduler left waiting (queued: it has a
    queue and no bind), or one submitted ``UNSEEN_GRACE_S`` ago that no cycle has answered. Jobs that
    arrive on a cluster with room are bound by the first cycle that sees them, ~0.1-0.5 s after their
    submission: forking the whole fold every few seconds for them would predict what is about to happen
    anyway, for seconds of CPU each time at 12,500 nodes."""
    return any(
        job.queue is not None or now - job.submitted_at >= UNSEEN_GRACE_S for job in state.pending_jobs()
    )


class Predictor:
    """Learns from ``state`` as it changes and keeps the latest ``Answer`` encoded."""

    def __init__(
        self,
        state: Callable[[], ClusterState],
        settings: Settings,
        *,
        horizon_s: float = HORIZON_S,
        max_cycles: int = MAX_CYCLES,
        dry_run_budget_s: float = DRY_RUN_BUDGET_S,
        dry_run_exact_s: float = DRY_RUN_EXACT_S,
    ) -> None:
        self._state = state
        self.dry_run_budget_s = dry_run_budget_s
        self.dry_run_exact_s = min(dry_run_exact_s, dry_run_budget_s)
        self._settings = settings
        self.horizon_s = horizon_s
        self.max_cycles = max_cycles
        self.estimator = RuntimeEstimator()
        self.tracker = AccuracyTracker()
        # the P90 shown is the P90 run's, calibrated on the jobs predicted so far that started
        self.calibrator = WaitCalibrator()
        self.learned = 0
        self._seen_started: set[str] = set()
        self._done: set[str] = set()
        self.policy = SchedulingPolicy()
        self.refresh_s = 0.0
        self.latest: Predictions | None = None
        # the last refresh's P50 and P90 runs: what each job holds from when to when (dry runs' fallback)
        self.forecasts: tuple[Forecast, Forecast] | None = None
        self.dry_runs_estimated = 0  # dry runs answered from the forecast
        self.encoded = self._encode()
        # one refresh at a time: the estimator's clock only moves forward, and refreshes take ``now`` from
        # the clock; dry runs one at a time too, beside a refresh (they leave the clock where it is): a dry
        # run never waits for a refresh, which on a large queue takes minutes
        self._running = asyncio.Lock()
        self._dry_running = asyncio.Lock()
        self._ready: ReadyFork | None = None  # the next dry run's fork, made ahead (under _dry_running)
        self._preparing: asyncio.Task[None] | None = None
        self.ready_taken = 0  # dry runs that ran from a fork made ahead
        self._dry_run_asked_at: float | None = None  # time.monotonic() of the last dry run asked
        # open (set) unless a dry run is being answered: a refresh's run forward waits on it between cycles
        self._dry_gate = threading.Event()
        self._dry_gate.set()
        self._dry_runs_now = 0

    def observe(self, job_ids: set[str] | None) -> None:
        """Learn from the jobs ``job_ids`` (None: all of them) as the fold has them now."""
        jobs = self._state().jobs
        views = (
            [jobs[j] for j in sorted(job_ids) if j in jobs] if job_ids is not None else list(jobs.values())
        )
        ended = [v for v in views if v.job_id not in self._done and v.ended_at is not None]
        for view in views:
            if view.started_at is not None and view.job_id not in self._seen_started:
                self._seen_started.add(view.job_id)
                self.tracker.started(view.job_id, view.started_at)
                self.calibrator.started(view.job_id, view.started_at)
        self.learned += learn(self.estimator, ended)
        for view in ended:
            self._done.add(view.job_id)
            self.calibrator.forget(view.job_id)  # ended without starting: nothing to learn
            runtime = runtime_of(view)
            if runtime is None:
                self.tracker.forget(view.job_id)
            else:
                self.tracker.completed(view.job_id, runtime)

    async def _predict(self, encoded: bytes, now: float | None) -> tuple[Predictions, Forecast, Forecast]:
        """A refresh's predictions for the fold ``encoded`` and its runs' forecasts, decoded and computed
        off the event loop, one at a time. Its run forward waits before each cycle while a dry run is
        being answered (``_dry_gate``): on a large queue a refresh runs most of the time, and a dry run
        sharing the interpreter with it would take twice as long."""
        async with self._running:
            at = time.time() if now is None else now
            return await asyncio.to_thread(self._refresh_run, encoded, at)

    def _give_way(self) -> None:
        """Wait while a dry run is being answered, but at most ``GIVE_WAY_S`` at each point: dry runs
        coming one after another never stop a refresh."""
        self._dry_gate.wait(GIVE_WAY_S)

    def _refresh_run(self, encoded: bytes, at: float) -> tuple[Predictions, Forecast, Forecast]:
        self._give_way()
        return predict_and_forecast(
            ClusterState.decode(encoded),
            self.policy,
            self.estimator,
            at,
            learned_jobs=self.learned,
            horizon_s=self.horizon_s,
            max_cycles=self.max_cycles,
            pause=self._give_way,
        )

    async def dry_run(
        self, spec: JobSpec, now: float | None = None, *, jobs_ahead: int | None = None
    ) -> PredictedStart:
        """The predicted start of a job with ``spec`` if it were submitted now (``POST /v1/jobs?dry_run``):
        a fork with its submission folded in, run forward as a refresh is, until that job started. It reads
        the leader's settings as a refresh does (a dry run may come before the first refresh ends). Dry
        runs go one at a time, off the event loop (the fold is only encoded on it), beside a refresh under
        way, and leave the estimator's clock where it was. The fork is the one made ahead (``ReadyFork``)
        when the fold has not moved since; another is made for the next dry run once this one answered.
        Once a refresh made a forecast, the job is first fitted into it (``basis`` ``forecast``;
        ``profile.estimate_start``, behind the ``jobs_ahead`` waiting jobs the API's cycle ordered before
        it, None: all), and that estimate answers unless the run forward is expected to reach the
        estimated start within ``dry_run_exact_s`` and does. Without a forecast, ``live.OutOfTime`` when
        the run forward has no answer within ``dry_run_budget_s`` of the question."""
        asked = self._dry_run_asked_at = time.monotonic()
        self._dry_runs_now += 1
        self._dry_gate.clear()
        try:
            return await self._answer_dry_run(spec, now, jobs_ahead, asked)
        finally:
            self._dry_runs_now -= 1
            if not self._dry_runs_now:
                self._dry_gate.set()

    async def _answer_dry_run(
        self, spec: JobSpec, now: float | None, jobs_ahead: int | None, asked: float
    ) -> PredictedStart:
        policy = policy_of(await self._settings())
        at = time.time() if now is None else now
        forecasts = self.forecasts
        estimated = None
        if forecasts is not None:
            estimated = await asyncio.to_thread(self._estimate, forecasts, spec, at, jobs_ahead)
            if estimated is not None and forecasts[0].cost_until(estimated.p50) > self.dry_run_exact_s:
                self.dry_runs_estimated += 1
                return estimated
        budget = self.dry_run_budget_s if estimated is None else self.dry_run_exact_s
        try:
            async with self._dry_running:
                fork = self._take_ready(policy) or self._state().encode()
                return await asyncio.to_thread(self._dry_run, fork, spec, policy, at, asked + budget)
        except OutOfTime:
            if estimated is None:
                raise
            self.dry_runs_estimated += 1
            return estimated
        finally:
            self.prepare(policy, at)

    def _estimate(
        self, forecasts: tuple[Forecast, Forecast], spec: JobSpec, at: float, jobs_ahead: int | None
    ) -> PredictedStart | None:
        """``spec``'s start fitted into the last refresh's P50 and P90 forecasts; None for a job the
        forecast cannot fit (a fraction or a MIG slice of a GPU)."""
        if spec.gpu_milli is not None or spec.gpu_memory_mib is not None or spec.mig_profile is not None:
            return None
        runtime = self.estimator.estimate(spec_features(spec, DRY_RUN_JOB), at, advance=False)
        types = spec.gpu_types or ((spec.gpu_type,) if spec.gpu_type is not None else None)
        limit = None if spec.time_limit_s is None else float(spec.time_limit_s)
        p50, p90 = (
            estimate_start(
                f,
                gpus=spec.gpus,
                gpus_per_task=spec.gpus_per_task,
                gpu_types=types,
                jobs_ahead=jobs_ahead,
                limit_s=limit,
                now=at,
            )
            for f in forecasts
        )
        if p50 is not None and p90 is not None:
            p90 = max(p50, p90)
        start = PredictedStart(
            p50=p50,
            p90=p90,
            runtime_p50_s=runtime.p50,
            runtime_key=runtime.key,
            basis="forecast",
            forecast_seq=forecasts[0].seq,
            forecast_at=forecasts[0].now,
        )
        return self._calibrated(start, at)

    def _take_ready(self, policy: SchedulingPolicy) -> ReadyFork | None:
        """The fork made ahead, if it is of the fold as it is now and of ``policy``; used up either way."""
        ready, self._ready = self._ready, None
        if ready is None or ready.seq != self._state().last_seq or ready.version != policy.version:
            return None
        self.ready_taken += 1
        return ready

    def prepare(self, policy: SchedulingPolicy, now: float) -> None:
        """Make the next dry run's fork of the fold as it is now, off the event loop (unless one of this
        fold is ready or being made)."""
        if self._preparing is not None and not self._preparing.done():
            return
        ready = self._ready
        if ready is not None and ready.seq == self._state().last_seq and ready.version == policy.version:
            return
        self._preparing = asyncio.get_running_loop().create_task(self._prepare(policy, now))

    async def _prepare(self, policy: SchedulingPolicy, now: float) -> None:
        async with self._dry_running:  # a dry run arriving meanwhile waits for it rather than redo it
            encoded = self._state().encode()
            self._ready = await asyncio.to_thread(ReadyFork, encoded, policy, now)

    async def preparing(self) -> None:
        """Until the fork being made ahead is ready (nothing when none is being made)."""
        if self._preparing is not None:
            await asyncio.shield(self._preparing)

    def _dry_run(
        self, fork: ReadyFork | bytes, spec: JobSpec, policy: SchedulingPolicy, at: float, deadline: float
    ) -> PredictedStart:
        if time.monotonic() > deadline:
            raise OutOfTime("the budget was spent waiting for the dry runs before it")
        if isinstance(fork, bytes):
            state = ClusterState.decode(fork)
            state.apply(state.last_seq + 1, JobSubmitted(job_id=DRY_RUN_JOB, spec=spec, submitted_at=at))
            given: ClusterState | ReadyFork = state
        else:
            fork.submit(DRY_RUN_JOB, spec, at)
            given = fork
        predictions = predict(
            given,
            policy,
            self.estimator,
            at,
            learned_jobs=self.learned,
            horizon_s=self.horizon_s,
            max_cycles=self.max_cycles,
            only=DRY_RUN_JOB,
            advance_clock=False,
            deadline=deadline,
            consume=True,  # the fork is this dry run's: its P50 run uses it
        )
        return self._calibrated(predictions.jobs[DRY_RUN_JOB], at)

    def _calibrated(self, start: PredictedStart, now: float) -> PredictedStart:
        """``start`` with its P90 run's start calibrated (``WaitCalibrator``)."""
        return msgspec.structs.replace(start, p90=self.calibrator.p90(now, start.p50, start.p90))

    async def refresh(self, now: float | None = None) -> Predictions:
        """New predictions for the fold as it is now, computed off the event loop. Where nothing waits
        there is nothing to run forward: no fork is made (seconds of CPU at 12,500 nodes, every few
        seconds while jobs come and start at once), the predictions are empty and there is no forecast (a
        dry run's own run forward is then a few cycles of its job alone). A job no cycle has looked at
        yet does not count as waiting (``waits_for_prediction``)."""
        self.policy = policy_of(await self._settings())
        state = self._state()
        began = time.perf_counter()
        if waits_for_prediction(state, time.time() if now is None else now):
            run, forecast_p50, forecast_p90 = await self._predict(state.encode(), now)
            self.forecasts = (forecast_p50, forecast_p90)
        else:
            at = time.time() if now is None else now
            run = Predictions(seq=state.last_seq, now=at, horizon_s=self.horizon_s, learned_jobs=self.learned)
            self.forecasts = None
        self.refresh_s = time.perf_counter() - began
        self.calibrator.calibrate(run.now)
        for job_id, start in run.jobs.items():
            self.calibrator.predicted(job_id, run.now, start.p90)
        calibrated = {job_id: self._calibrated(start, run.now) for job_id, start in run.jobs.items()}
        predictions = msgspec.structs.replace(run, jobs=calibrated)
        self.latest = predictions
        self.tracker.remember(predictions)
        self.encoded = self._encode()
        if self._dry_runs_asked():
            self.prepare(self.policy, predictions.now)
        return predictions

    def _dry_runs_asked(self) -> bool:
        """Whether a dry run came within ``DRY_RUN_DEMAND_S``: only then does a refresh make the next dry
        run's fork ahead (a decode and a model build of the whole fold: ~1.4 s of CPU at 12,500 nodes, on
        every refresh of a log that moves)."""
        asked = self._dry_run_asked_at
        return asked is not None and time.monotonic() - asked <= DRY_RUN_DEMAND_S

    def _encode(self) -> bytes:
        accuracy = self.tracker.accuracy
        answer = Answer(
            predictions=self.latest,
            policy=self.policy.name,
            refresh_s=round(self.refresh_s, 4),
            accuracy=accuracy,
            shares=accuracy.shares(),
        )
        return msgspec.json.encode(answer)
