"""Predicted starts on the live cluster: its fold forked and run forward by the scheduler's own cycle.

The predictor service (``services/predictor``) calls :func:`predict` on a copy of its fold. The copy is
driven as the twin drives its live side (``sim.twin.LiveSide``): the leader's cycle (admissions, then
``SchedulingPolicy.decide_live`` on the synced model), its writes folded at once, and what the job
controller would report when it carries them out (``JobStarted``, ``JobPreempted``, ``JobResized``).
Between cycles the clock jumps to the next moment something changes: a job ends (``JobCompleted`` after
its estimated runtime) or a waiting retry comes due. So a waiting job's predicted start is the moment the
real policy, with the cluster's queues and quotas, would bind it if every job ran as long as estimated.

Two runs per refresh: one with every job's P50 runtime (the P50 start), one with its P90 runtime (the
P90 run's start: later, since everything ahead of it runs longer; the service calibrates it,
``calibration``). Where no job's P90 runtime differs from its P50 one, the P90 run would be the P50 run
again and is not made. The estimates come from
``RuntimeEstimator``, fed only with jobs that have ended (``learn``). Pure and deterministic: the same
fold, estimator and ``now`` give the same predictions.

Limits, said where they are shown (docs/prediction.md): arrivals still to come are unknown (a
higher-priority job submitted later moves a prediction back); node failures and repairs are not
foreseen; a job not started within ``horizon_s`` or ``max_cycles`` gets no prediction (None), never a
made-up one.

A dry run (``refresh.Predictor.dry_run``) asks for one job only (``predict(..., only=job_id)``): each run
then stops as soon as that job started, or can no longer start (rejected, or the horizon reached), instead
of running until every waiting job did. What happens to the jobs after its start cannot change it, so its
predicted start is the full run's, for fewer cycles. A dry run is answered within a wall-clock
``deadline`` or not at all (``OutOfTime``): on a large queue its job may start only hundreds of cycles on.
"""

from __future__ import annotations

import heapq
import shlex
import time
from collections.abc import Callable, Iterable
from typing import Literal, TypedDict, Unpack

import msgspec

from rallypoint.core import Decisions
from rallypoint.events import (
    GangBound,
    GangResized,
    JobCompleted,
    JobSpec,
    JobSubmitted,
    PreemptionRequested,
)
from rallypoint.events.subjects import members
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.cycle import decide, writes_before_deciding
from rallypoint.scheduling.writes import Write
from rallypoint.sim.twin import LiveSide
from rallypoint.state import ACTIVE, TERMINAL, ClusterState, JobView

from .profile import Forecast, Hold
from .runtimes import JobFeatures, RuntimeEstimate, RuntimeEstimator

__all__ = [
    "ForwardRun",
    "HoldRecorder",
    "OutOfTime",
    "PredictedStart",
    "Predictions",
    "ReadyFork",
    "features_of",
    "learn",
    "predict",
    "predict_and_forecast",
    "run_forward",
    "spec_features",
]

#: How far ahead a prediction is made, and how many cycles a run may take to get there.
HORIZON_S = 7 * 86400.0
MAX_CYCLES = 2000
# The shortest runtime the fork gives a job: what a job estimated to be done already still needs.
_MIN_REMAINING_S = 1.0


class PredictedStart(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A waiting job's start if every job runs its P50 (``p50``) or its P90 runtime (``p90``), Unix
    seconds (None: not within the horizon), and its own runtime estimate (P50 seconds, in all) and the
    history it came from (``runtime_key``: the estimator's key, "none" without any). ``basis``: ``run``, a
    run forward with the job in it; ``forecast``, a dry run's job fitted into the forecast of the refresh
    of log position ``forecast_seq`` made at ``forecast_at`` (``profile.estimate_start``)."""

    p50: float | None
    p90: float | None
    runtime_p50_s: float
    runtime_key: str
    basis: Literal["run", "forecast"] = "run"
    forecast_seq: int | None = None
    forecast_at: float | None = None


class Predictions(msgspec.Struct, frozen=True, kw_only=True):
    """One refresh: the log position (``seq``) and clock (``now``) it was computed at, its horizon, how
    many ended jobs the runtimes were learned from, and the waiting jobs' predicted starts by id."""

    seq: int
    now: float
    horizon_s: float
    learned_jobs: int
    jobs: dict[str, PredictedStart] = {}


def features_of(job: JobView) -> JobFeatures:
    """What the estimator keys a live job's runtime on: its team, size, name, command, class and limit."""
    return spec_features(job.spec, job.job_id)


def spec_features(spec: JobSpec, job_id: str) -> JobFeatures:
    """``features_of`` for a job of ``spec`` known as ``job_id`` (a dry run's, which the fold has not)."""
    return JobFeatures(
        team=spec.team,
        gpus=spec.gpus,
        job_id=job_id,
        name=spec.name,
        command=shlex.join(spec.command),
        priority_class=spec.priority,
        time_limit_s=None if spec.time_limit_s is None else float(spec.time_limit_s),
    )


def runtime_of(job: JobView) -> float | None:
    """Seconds a completed job ran in all (its earlier attempts' and the last one's); None if unknown."""
    if job.state != "completed" or job.started_at is None or job.ended_at is None:
        return None
    return job.run_s + max(0.0, job.ended_at - job.started_at)


def learn(estimator: RuntimeEstimator, jobs: Iterable[JobView]) -> int:
    """Feed the completed ones of ``jobs`` to ``estimator``, by end time; how many it learned. An end
    older than the estimator's clock (a service's clock behind the predictor's) counts as of that clock."""
    done = sorted(
        ((job.ended_at or 0.0, job.job_id, job) for job in jobs if runtime_of(job)), key=lambda t: t[:2]
    )
    for ended_at, _, job in done:
        runtime = runtime_of(job)
        assert runtime is not None
        estimator.observe(max(ended_at, estimator.clock), features_of(job), max(runtime, 1e-3))
    return len(done)


Runtime = Callable[[JobView], float]


class OutOfTime(Exception):
    """A run forward passed its ``deadline`` (``time.monotonic``) before it could answer."""


class ReadyFork:
    """A copy of a fold made before it is needed (``refresh.Predictor`` keeps one for the next dry run):
    decoded, with the scheduler's model built on it and its waiting jobs converted (``ModelSync``), as
    ``policy`` (its ``version``) decides. A run forward from it starts at once, on the model the first
    cycle would otherwise build. Used once: the run consumes it."""

    def __init__(self, encoded: bytes, policy: SchedulingPolicy, now: float) -> None:
        state = ClusterState.decode(encoded)
        self.seq = state.last_seq
        self.version = policy.version
        self.side = LiveSide.over(state, _own(policy))
        mine = self.side.policy
        # the sync the first cycle would do, and the waiting jobs' conversion (cached by value: ``now``
        # only picks which are ready); the fold's later changes reach the model through ``side.changes``
        mine.model_sync.snapshot(
            state,
            now,
            queues=mine.queues,
            priority_classes=mine.priority_classes,
            changed=self.side.changes.take(),
        )

    def submit(self, job_id: str, spec: JobSpec, at: float) -> None:
        """``job_id`` submitted at ``at`` (a dry run's job), folded into the copy."""
        self.side.append(JobSubmitted(job_id=job_id, spec=spec, submitted_at=at))


def _own(policy: SchedulingPolicy) -> SchedulingPolicy:
    """The same policy with a model of its own (a run forward mutates its policy's ``ModelSync``)."""
    return SchedulingPolicy(policy.name, queues=policy.queues, priority_classes=policy.priority_classes)


class _Held(msgspec.Struct, kw_only=True):
    """An attempt's hold while the run goes on: from ``start``, until ``end`` as planned so far."""

    start: float
    end: float
    waiting: bool
    gpus: tuple[tuple[str, int], ...]


class HoldRecorder:
    """What each job holds in a run forward, from when to when (``profile.Hold``): the forecast a dry run
    is fitted into when running its own fork would take too long (``profile.estimate_start``)."""

    def __init__(self, state: ClusterState) -> None:
        self.nodes = {n.node_id: (n.gpu_type, len(n.gpus)) for n in state.nodes.values() if n.schedulable}
        self.open: dict[tuple[str, int], _Held] = {}  # by (job id, attempt)
        self.closed: list[Hold] = []
        # each waiting job's place in the policy's order at the run's first cycle (-1: bound by it)
        self.rank: dict[str, int] = {}
        # attempts asked to stop for a preemptor: their GPUs stay taken until the next cycle, which binds it
        self._preempted: list[tuple[str, int]] = []

    def ranked(self, decisions: Decisions) -> None:
        """The first cycle's order: its pending jobs' positions, its binds before them all."""
        self.rank.update((reason.job_id, reason.position) for reason in decisions.pending)
        self.rank.update((bind.job_id, -1) for bind in decisions.binds)

    def began(self, job: JobView, start: float, end: float, waiting: bool) -> None:
        """``job``'s attempt holds its placements from ``start`` (the GPUs read now: an ended attempt's
        placements are gone from the fold)."""
        per_node: dict[str, int] = {}
        for placement in job.placements:
            per_node[placement.node_id] = per_node.get(placement.node_id, 0) + len(placement.gpus)
        gpus = tuple(sorted(per_node.items()))
        self.open[(job.job_id, job.attempt)] = _Held(start=start, end=end, waiting=waiting, gpus=gpus)

    def stopped(self, job_id: str, attempt: int, at: float) -> None:
        """The attempt stopped at ``at`` (completed, or resized away)."""
        held = self.open.pop((job_id, attempt), None)
        if held is not None:
            self.closed.append(self._hold(job_id, held, at))

    def preempted(self, job_id: str, attempt: int) -> None:
        """The attempt was asked to stop for a preemptor: it holds its GPUs until the next cycle."""
        self._preempted.append((job_id, attempt))

    def cycle_begins(self, at: float) -> None:
        """A cycle at ``at``: the GPUs of the attempts preempted at the last one pass to their preemptors."""
        for job_id, attempt in self._preempted:
            self.stopped(job_id, attempt, at)
        self._preempted.clear()

    def _hold(self, job_id: str, held: _Held, end: float | None) -> Hold:
        rank = self.rank.get(job_id) if held.waiting else None
        return Hold(job_id=job_id, rank=rank, start=held.start, end=end, gpus=held.gpus, waiting=held.waiting)

    def forecast(
        self, seq: int, now: float, horizon_s: float, costs: tuple[tuple[float, float], ...]
    ) -> Forecast:
        """The holds so far, those still open ending when planned, and the run's ``costs``."""
        still = [self._hold(job_id, held, held.end) for (job_id, _), held in self.open.items()]
        holds = sorted([*self.closed, *still], key=lambda h: (h.start, h.job_id))
        return Forecast(
            seq=seq, now=now, horizon_s=horizon_s, nodes=dict(self.nodes), holds=tuple(holds), costs=costs
        )


class ForwardRun:
    """One run forward of a forked fold: who ends when, when each waiting job started, and how many
    cycles it took (``cycles``). ``record``: note what each job holds from when to when (``holds``)."""

    def __init__(
        self,
        fork: ClusterState | ReadyFork,
        policy: SchedulingPolicy,
        runtime: Runtime,
        now: float,
        *,
        record: bool = False,
    ) -> None:
        self.side = fork.side if isinstance(fork, ReadyFork) else LiveSide.over(fork, policy)
        state = self.side.state
        self.runtime = runtime
        self.waiting = {job.job_id for job in state.pending_jobs()}
        self.starts: dict[str, float] = {}
        self.end_at: dict[str, float] = {}
        self.ends: list[tuple[float, str, int]] = []
        self.cycles = 0
        self.costs: list[tuple[float, float]] = []  # (clock, wall seconds) of each step, by run_forward
        self.holds = HoldRecorder(state) if record else None
        for job in sorted(state.active_jobs(), key=lambda j: j.job_id):
            began = job.started_at if job.started_at is not None else now
            end = max(now, began + runtime(job))
            self._ends(job, end)
            if self.holds is not None:
                self.holds.began(job, began, end, waiting=False)

    def _ends(self, job: JobView, at: float) -> None:
        self.end_at[job.job_id] = at
        heapq.heappush(self.ends, (at, job.job_id, job.attempt))

    def cycle(self, now: float) -> None:
        """The leader's cycle at ``now``, carried out at once; note the starts and when each will end."""
        if self.holds is not None:
            self.holds.cycle_begins(now)
        writes = self._decide(now)
        self.cycles += 1
        self.side.carry_out(writes, now)
        jobs = self.side.state.jobs
        for event in (member for write in writes for member in members(write.event)):
            if isinstance(event, GangBound):
                if event.job_id in self.waiting:
                    self.starts.setdefault(event.job_id, now)
                job = jobs[event.job_id]
                self._ends(job, now + self.runtime(job))
                if self.holds is not None:
                    self.holds.began(job, now, self.end_at[job.job_id], event.job_id in self.waiting)
            elif isinstance(event, GangResized):  # the same work on another size: it ends as it would
                end = self.end_at.get(event.job_id, now)
                self._ends(jobs[event.job_id], end)
                if self.holds is not None:
                    self.holds.stopped(event.job_id, event.attempt - 1, now)
                    self.holds.began(jobs[event.job_id], now, end, event.job_id in self.waiting)
            elif isinstance(event, PreemptionRequested) and self.holds is not None:
                self.holds.preempted(event.job_id, event.attempt)

    def _decide(self, now: float) -> list[Write]:
        """The writes of ``LiveSide.cycle`` (admissions, then ``decide`` on the synced model) without its
        audit (a second cycle on a snapshot built from scratch, to compare with): the same writes, for a
        tenth of the time on the bench's fold at 1,000 nodes. Nor the pending reasons (rejections kept):
        no decision reads them, and they cost a pass over every waiting job per cycle."""
        side = self.side
        first, admissions = writes_before_deciding(side.state, now, repairs=())
        for write in first:
            side.append(write.event)
        decided = decide(
            side.policy, side.state, now, side.changes, epoch=side.epoch, admissions=admissions, reasons=False
        )
        if decided is None:
            return admissions
        if self.holds is not None and self.cycles == 0:
            self.holds.ranked(decided[0])
        return decided[1]

    def settled(self, job_id: str) -> bool:
        """Whether ``job_id`` started in this run or can no longer start (gone, rejected, cancelled)."""
        job = self.side.state.jobs.get(job_id)
        return job_id in self.starts or job is None or job.state in TERMINAL

    def next_moment(self, now: float) -> float | None:
        """When something next changes after ``now``: the next end, or a waiting retry coming due."""
        state = self.side.state
        while self.ends:
            _, job_id, attempt = self.ends[0]
            job = state.jobs[job_id]
            if job.attempt == attempt and job.state in ACTIVE:
                break
            heapq.heappop(self.ends)  # preempted, resized or ended since: stale
        retries = (j.retry_at for j in state.pending_jobs() if j.retry_at is not None and j.retry_at > now)
        moments = [*([self.ends[0][0]] if self.ends else []), *retries]
        return min(moments) if moments else None

    def complete_due(self, now: float) -> None:
        """Every job whose estimated end is ``now`` completes, as its job controller would report."""
        state = self.side.state
        while self.ends and self.ends[0][0] <= now:
            _, job_id, attempt = heapq.heappop(self.ends)
            job = state.jobs[job_id]
            if job.attempt == attempt and job.state in ACTIVE:
                self.side.append(JobCompleted(job_id=job_id, attempt=attempt, at=now))
                if self.holds is not None:
                    self.holds.stopped(job_id, attempt, now)


def run_forward(
    state: ClusterState | ReadyFork,
    policy: SchedulingPolicy,
    runtime: Runtime,
    now: float,
    *,
    horizon_s: float = HORIZON_S,
    max_cycles: int = MAX_CYCLES,
    until: str | None = None,
    deadline: float | None = None,
    record: bool = False,
    pause: Callable[[], object] | None = None,
) -> ForwardRun:
    """``state`` run forward until every job waiting in it started, or only until ``until`` did (or can
    no longer: rejected, cancelled), if every job runs ``runtime(job)`` seconds in all (for a running one,
    from its attempt's start); the run: when each started (``starts``), in how many ``cycles``. ``state``
    is used up: pass a copy (a ``ReadyFork`` runs with its own policy). ``deadline``: ``OutOfTime`` when
    a cycle would begin after it. ``record``: the run notes what each job holds (``ForwardRun.holds``)
    and the wall seconds of each of its steps (``costs``). ``pause``: called before each cycle, to wait
    there while something more urgent runs (a refresh gives way to a dry run)."""
    if pause is not None:
        pause()
    began = time.perf_counter()
    run = ForwardRun(state, policy, runtime, now, record=record)
    run.costs.append((now, time.perf_counter() - began))
    t = now
    for _ in range(max_cycles):
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime(f"no answer after {run.cycles} cycles, up to {t - now:.0f} s ahead")
        if pause is not None:
            pause()
        began = time.perf_counter()
        run.cycle(t)
        run.costs.append((t, time.perf_counter() - began))
        if run.settled(until) if until is not None else run.waiting <= run.starts.keys():
            break
        later = run.next_moment(t)
        if later is None or later > now + horizon_s:
            break
        t = max(t, later)
        run.complete_due(t)
    return run


class _Runtimes:
    """Each job's runtime in a fork, less what it ran in earlier attempts, at ``quantile`` ("p50",
    "p90"), estimated once per attempt. Asked for the P50, it also notes whether the P90 would have
    differed for any job (``differs``): where none does, a P90 run would ask the same questions, get the
    same answers and so take the very same path, and the P50 run's starts are the P90 run's."""

    def __init__(self, estimator: RuntimeEstimator, now: float, quantile: str, advance: bool) -> None:
        self.estimator, self.now, self.quantile, self.advance = estimator, now, quantile, advance
        self.cache: dict[tuple[str, int], RuntimeEstimate] = {}
        self.differs = False

    def __call__(self, job: JobView) -> float:
        key = (job.job_id, job.attempt)
        estimate = self.cache.get(key)
        if estimate is None:
            now = self.now
            elapsed = job.run_s + (now - job.started_at if job.state in ACTIVE and job.started_at else 0.0)
            estimate = self.estimator.estimate(features_of(job), now, max(0.0, elapsed), advance=self.advance)
            self.cache[key] = estimate
        value = max(_MIN_REMAINING_S, getattr(estimate, self.quantile) - job.run_s)
        if not self.differs and value != max(_MIN_REMAINING_S, estimate.p90 - job.run_s):
            self.differs = True
        return value


def _start(job: JobView, runs: dict[str, dict[str, float]], runtime: RuntimeEstimate) -> PredictedStart:
    p50, p90 = runs["p50"].get(job.job_id), runs["p90"].get(job.job_id)
    if p50 is not None and p90 is not None:
        p90 = max(p50, p90)  # a longer run ahead can reorder a fork's preemptions; never shown backwards
    return PredictedStart(p50=p50, p90=p90, runtime_p50_s=runtime.p50, runtime_key=runtime.key)


def predict(
    state: ClusterState | ReadyFork,
    policy: SchedulingPolicy,
    estimator: RuntimeEstimator,
    now: float,
    *,
    learned_jobs: int = 0,
    horizon_s: float = HORIZON_S,
    max_cycles: int = MAX_CYCLES,
    only: str | None = None,
    advance_clock: bool = True,
    deadline: float | None = None,
    consume: bool = False,
) -> Predictions:
    """Every waiting job's P50 and P90 start; ``state`` is left as it was (each run forks its own copy),
    unless ``consume`` (a copy the caller gives away: the P50 run uses it, one copy fewer) or it is a
    ``ReadyFork`` (always given away, and run with its own policy).
    ``only``: that waiting job's alone (a dry run's), each run stopping once it started.
    ``advance_clock=False``: the estimator's clock stays where it was (``RuntimeEstimator.estimate``).
    ``deadline`` (``time.monotonic``): ``OutOfTime`` when a run has not answered by then.
    The P90 run is made only where some job's P90 runtime differs from its P50 one on the P50 run's path;
    else it would be the same run (``_Runtimes``)."""
    return _predict(
        state, policy, estimator, now, learned_jobs=learned_jobs, horizon_s=horizon_s, max_cycles=max_cycles,
        only=only, advance_clock=advance_clock, deadline=deadline, consume=consume, record=False, pause=None,
    )[0]  # fmt: skip


class RefreshOptions(TypedDict, total=False):
    """``predict``'s options a refresh sets (their defaults: none learned, ``HORIZON_S``, ``MAX_CYCLES``)."""

    learned_jobs: int
    horizon_s: float
    max_cycles: int
    pause: Callable[[], object]


def predict_and_forecast(
    state: ClusterState,
    policy: SchedulingPolicy,
    estimator: RuntimeEstimator,
    now: float,
    **options: Unpack[RefreshOptions],
) -> tuple[Predictions, Forecast, Forecast]:
    """A refresh's ``predict``, and what each job holds from when to when in its P50 run and in its P90
    run (the same forecast twice where the P90 run is the P50 one): what a dry run is fitted into when
    running its own fork would take too long (``profile.estimate_start``)."""
    horizon_s = options.get("horizon_s", HORIZON_S)
    predictions, runs = _predict(
        state, policy, estimator, now, learned_jobs=options.get("learned_jobs", 0), horizon_s=horizon_s,
        max_cycles=options.get("max_cycles", MAX_CYCLES), only=None, advance_clock=True, deadline=None,
        consume=False, record=True, pause=options.get("pause"),
    )  # fmt: skip
    forecasts = []
    for run in (runs["p50"], runs["p90"]):
        assert run.holds is not None
        forecasts.append(run.holds.forecast(predictions.seq, now, horizon_s, tuple(run.costs)))
    return predictions, forecasts[0], forecasts[1]


def _predict(
    state: ClusterState | ReadyFork,
    policy: SchedulingPolicy,
    estimator: RuntimeEstimator,
    now: float,
    *,
    learned_jobs: int,
    horizon_s: float,
    max_cycles: int,
    only: str | None,
    advance_clock: bool,
    deadline: float | None,
    consume: bool,
    record: bool,
    pause: Callable[[], object] | None,
) -> tuple[Predictions, dict[str, ForwardRun]]:
    fold = state.side.state if isinstance(state, ReadyFork) else state
    seq = fold.last_seq
    waiting = [job for job in fold.pending_jobs() if only is None or job.job_id == only]
    given = isinstance(state, ReadyFork) or consume
    if pause is not None:
        pause()
    encoded = fold.encode()  # the copy of each run that needs one, taken before the given one runs

    def run(fork: ClusterState | ReadyFork, runtime: _Runtimes) -> ForwardRun:
        return run_forward(
            fork, _own(policy), runtime, now, horizon_s=horizon_s, max_cycles=max_cycles, until=only,
            deadline=deadline, record=record, pause=pause,
        )  # fmt: skip

    def fork() -> ClusterState:
        if pause is not None:
            pause()
        return ClusterState.decode(encoded)

    p50 = _Runtimes(estimator, now, "p50", advance_clock)
    runs = {"p50": run(state if given else fork(), p50)}
    runs["p90"] = run(fork(), _Runtimes(estimator, now, "p90", advance_clock)) if p50.differs else runs["p50"]
    starts = {quantile: forward.starts for quantile, forward in runs.items()}
    jobs = {
        job.job_id: _start(job, starts, estimator.estimate(features_of(job), now, advance=advance_clock))
        for job in waiting
    }
    predictions = Predictions(seq=seq, now=now, horizon_s=horizon_s, learned_jobs=learned_jobs, jobs=jobs)
    return predictions, runs
