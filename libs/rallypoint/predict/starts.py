"""Predicted starts, and the accuracy harness of ``rally sim predict``.

The workload is replayed once with the real core (the truth). At each instant, every job submitted then
that the core left waiting gets its start predicted from what the cluster knew at that instant: the
simulation is forked (sim/fork.py: no arrival or failure still to come), every running and waiting
job's runtime is set to its estimate, and the fork runs forward with the same core and policy until the
jobs of that instant have started. Three forks per instant: the estimator's P50 runtimes (the P50 start),
its P90 runtimes (the P90 start) and, as Slurm's ``squeue --start`` does, every job's time limit (the
baseline). A job the core started at its submit instant needs no fork: its start is known then.

The P90 start reported is the P90 run's, calibrated on the predictions resolved so far
(``calibration.WaitCalibrator``: its wait scaled so that about 90% of the last jobs predicted started
within theirs); the P90 run's own start is kept beside it (``p90_run``).

The estimator (runtimes.py) learns only from the jobs of the replay that have ended, as they end; its
clock refuses anything else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rallypoint.scheduling.queues import Queues
from rallypoint.sim.cluster import Cluster
from rallypoint.sim.engine import SimOptions, Simulator
from rallypoint.sim.fork import fork, progress, set_runtime
from rallypoint.sim.run import resolve_policy
from rallypoint.sim.workload import Job

from .calibration import WaitCalibrator
from .runtimes import JobFeatures, RuntimeEstimator

__all__ = ["BASELINE_DEFAULT_LIMIT_S", "Prediction", "predict_starts"]

# The baseline's runtime for a job without a time limit: a partition's default limit, as Slurm uses.
BASELINE_DEFAULT_LIMIT_S = 86400.0


@dataclass(frozen=True, slots=True)
class Prediction:
    """One job's predicted start (P50, calibrated P90, baseline; None: not within the fork's run), its
    runtime estimate at submit, what really happened (``start`` None: it never started in the replay),
    and the P90 run's own start (``p90_run``; a job started at its submit has no run: its start)."""

    job_id: str
    submit: float
    p50: float | None
    p90: float | None
    baseline: float | None
    runtime_p50: float
    duration: float
    start: float | None = None
    p90_run: float | None = None


def features(job: Job, priority_class: str) -> JobFeatures:
    """What a cluster knows of a workload's job (a workload has no user, name or command)."""
    return JobFeatures(
        team=job.team,
        gpus=job.gpus,
        job_id=job.id,
        priority_class=priority_class,
        time_limit_s=job.time_limit,
    )


class _Replay:
    """The after-instant hook of the true replay: feeds ended jobs to the estimator, predicts arrivals."""

    def __init__(self, sim: Simulator, estimator: RuntimeEstimator) -> None:
        self.sim = sim
        self.estimator = estimator
        self.arrivals = sorted(sim.jobs.values(), key=lambda sj: sj.seq)
        self.next_arrival = 0
        self.records_seen = 0
        self.predictions: dict[str, Prediction] = {}
        self.calibrator = WaitCalibrator()
        self.unresolved: set[str] = set()  # predicted, not started yet

    def __call__(self, now: float) -> bool:
        sim = self.sim
        self._resolve(now)
        for r in sim.records[self.records_seen :]:
            self.estimator.observe(r.end, features(sim.jobs[r.id].job, r.priority), r.duration)
        self.records_seen = len(sim.records)
        waiting = []
        while self.next_arrival < len(self.arrivals) and self.arrivals[self.next_arrival].job.submit <= now:
            sj = self.arrivals[self.next_arrival]
            self.next_arrival += 1
            if sj.job.id in sim.pending:
                waiting.append(sj.job.id)
            elif sj.first_start is not None:  # started at its submit instant: known at once
                self._keep(sj.job.id, now, now, now, now)
        if waiting:
            self._predict(waiting, now)
        return False

    def _resolve(self, now: float) -> None:
        """Teach the calibrator each predicted job that has started by ``now``."""
        for job_id in list(self.unresolved):
            started = self.sim.jobs[job_id].first_start
            if started is not None and started <= now:
                self.calibrator.started(job_id, started)
                self.unresolved.discard(job_id)

    def _keep(
        self,
        job_id: str,
        now: float,
        p50: float | None,
        p90: float | None,
        base: float | None,
        p90_run: float | None = None,
    ) -> None:
        sj = self.sim.jobs[job_id]
        est = self.estimator.estimate(features(sj.job, sj.pclass), now)
        self.predictions[job_id] = Prediction(
            job_id,
            sj.job.submit,
            p50,
            p90,
            base,
            est.p50,
            sj.job.duration,
            p90_run=p90 if p90_run is None else p90_run,
        )

    def _predict(self, waiting: list[str], now: float) -> None:
        sim = self.sim
        estimates = {
            jid: self.estimator.estimate(features(sj.job, sj.pclass), now, progress(sim, jid, now))
            for jid, sj in (*sim.running.items(), *sim.pending.items())
        }
        p50 = _forward(sim, waiting, now, lambda jid: estimates[jid].p50)
        p90 = _forward(sim, waiting, now, lambda jid: estimates[jid].p90)
        base = _forward(sim, waiting, now, lambda jid: _limit(sim.jobs[jid].job))
        self.calibrator.calibrate(now)
        for jid in waiting:
            run = p90[jid]
            self._keep(jid, now, p50[jid], self.calibrator.p90(now, p50[jid], run), base[jid], run)
            self.calibrator.predicted(jid, now, run)
            self.unresolved.add(jid)


def _limit(job: Job) -> float:
    return job.time_limit if job.time_limit is not None else BASELINE_DEFAULT_LIMIT_S


def _forward(
    sim: Simulator, targets: Sequence[str], now: float, runtime: Callable[[str], float]
) -> dict[str, float | None]:
    """Fork ``sim``, give every job the runtime ``runtime(job id)``, run until ``targets`` started."""
    f = fork(sim)
    for jid in list(f.jobs):
        set_runtime(f, jid, runtime(jid), now)

    def all_started(_: float) -> bool:
        return all(f.jobs[t].first_start is not None for t in targets)

    f.advance(all_started)
    return {t: f.jobs[t].first_start for t in targets}


def predict_starts(
    jobs: Sequence[Job],
    cluster: Cluster,
    queues: Queues | None,
    policy: str,
    estimator: RuntimeEstimator | None = None,
) -> list[Prediction]:
    """Every submitted job's prediction at its submit, with its actual start from the same replay."""
    sim = Simulator(jobs, cluster, policy, queues, SimOptions(), policy_obj=resolve_policy(policy))
    replay = _Replay(sim, estimator or RuntimeEstimator())
    sim.run(replay)
    return [_with_start(p, sim.jobs[jid].first_start) for jid, p in replay.predictions.items()]


def _with_start(p: Prediction, start: float | None) -> Prediction:
    return dataclasses.replace(p, start=start)
