"""Every attempt of every job, as the log tells it: the ledger that usage, history and the read model share.

The fold (``ClusterState``) keeps only a job's current attempt: a requeue resets ``started_at`` and drops
the placements. Accounting needs all of them, so ``AttemptLedger`` drives the fold and watches what each
event did to the job it names: a bind opens an attempt, a start stamps it, leaving bound/running closes
it. It never re-implements a rule of the fold (a stale or refused decision changes nothing in the fold,
so it opens nothing here either). Pure: no clock, no I/O.

What an attempt is charged: its bound GPUs from the start of its ranks (``JobStarted``) to the event that
ended it, the same span the fold counts as a preempted attempt's service (``run_s``). The launch wait
after a bind and the healthy nodes held while a gang waits for repair are not charged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from rallypoint.events import (
    Event,
    GangsBound,
    JobAttemptFailed,
    JobInterrupted,
    JobPreempted,
    JobSubmitted,
    RankExited,
    TaskPlacement,
)
from rallypoint.events.catalogue import GPU_MILLI, quota_milli
from rallypoint.events.codec import Quarantined
from rallypoint.state import LAUNCHED, ClusterState, JobView, NodeView

#: How an attempt ended, by the name of the event that ended it (names, not classes: a resize is an
#: elastic gang's new attempt, and the ledger need not import every decision to say so).
OUTCOMES: dict[str, str] = {
    "JobCompleted": "completed",
    "JobFailed": "failed",
    "JobAttemptFailed": "attempt-failed",
    "JobPreempted": "preempted",
    "JobInterrupted": "interrupted",
    "JobCancelled": "cancelled",
    "GangResized": "resized",
    "JobResized": "resized",  # the live resize's attempt ends when its ranks have stopped
}
#: An attempt the infrastructure ended (``JobInterrupted``, an ``infra`` ``JobAttemptFailed``): ``drained``
#: when a node it left was taken out of service (an operator's drain, a health cordon), else
#: ``interrupted`` (a lost node, a lost agent, the local cluster stopped). Neither is the job's failure.
DRAINED = "drained"
INTERRUPTED = "interrupted"
UNKNOWN_USER = "unknown"


class AttemptRecord(msgspec.Struct, kw_only=True):
    """One attempt of one job. ``outcome`` is ``bound`` or ``running`` while it lasts."""

    job_id: str
    attempt: int
    team: str
    user: str
    priority: str
    gpus: int
    placements: tuple[TaskPlacement, ...]
    bound_at: float
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str = "bound"
    reason: str = ""
    exit_code: int | None = None
    #: preemptions: the job the GPUs went to and the core's reason (reclaim, priority, las)
    preempted_for: str | None = None
    lost_gpu_s: float = 0.0
    resume_step: int | None = None
    last_seq: int = 0
    #: a share's or a MIG slice's part of its GPU, in thousandths (``quota_milli``), which it is charged
    #: for; None for whole GPUs (``gpus`` of them)
    gpu_milli: int | None = None
    #: the first rank whose non-zero exit the log recorded for this attempt, kept once the attempt has
    #: ended only when a rank's exit failed it (its ending event carries an exit code): the rank whose log
    #: says why, which ``rally logs`` shows by default. Ranks stopped afterwards exit non-zero too, later.
    failed_rank: int | None = None

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(p.node_id for p in self.placements))


def user_of(job: JobView, submitted_by: str | None = None) -> str:
    """Who submitted the job: ``JobSubmitted.submitted_by`` (the API token's user), else ``unknown``."""
    user = submitted_by or getattr(job, "submitted_by", None)
    return str(user) if user else UNKNOWN_USER


def _part_milli(job: JobView) -> int | None:
    """What a share or a MIG slice holds of its GPU, in thousandths; None for a job of whole GPUs."""
    spec = job.spec
    if spec.gpu_milli is None and spec.gpu_memory_mib is None and spec.mig_profile is None:
        return None
    return quota_milli(spec, job.placements)


def charged_gpu_s(rec: AttemptRecord, since: float | None, until: float | None, now: float) -> float:
    """GPU-seconds of ``rec`` inside [since, until]; a running attempt counts up to ``now``. A share or a
    MIG slice is charged its part of the GPU (``gpu_milli`` / 1000), as its quota counts it.

    The PostgreSQL read model evaluates the very same expression (``projection.usage``): keep them in step.
    """
    if rec.started_at is None:
        return 0.0
    end = rec.ended_at if rec.ended_at is not None else now
    low = rec.started_at if since is None else max(rec.started_at, since)
    high = end if until is None else min(end, until)
    span = high - low
    held = rec.gpus if rec.gpu_milli is None else rec.gpu_milli / GPU_MILLI
    return held * span if span > 0 else 0.0


class AttemptLedger(msgspec.Struct, kw_only=True):
    """Job id -> its attempts, oldest first. Encodes with msgspec (the projector snapshots it)."""

    jobs: dict[str, list[AttemptRecord]] = {}
    #: job id -> the user that submitted it, for jobs submitted with one (the fold does not keep it)
    users: dict[str, str] = {}

    def apply(self, state: ClusterState, seq: int, event: Event) -> list[AttemptRecord]:
        """Fold ``event`` into ``state`` and return the attempts it opened, started or ended."""
        if isinstance(event, GangsBound):
            return [record for bind in event.binds for record in self.apply(state, seq, bind)]
        job_id: str | None = getattr(event, "job_id", None)
        job = state.jobs.get(job_id) if job_id is not None else None
        before = (job.state, job.attempt) if job is not None else ("pending", 0)
        state.apply(seq, event)
        if isinstance(event, JobSubmitted) and job_id not in self.users:
            submitted_by = getattr(event, "submitted_by", None)  # absent before the API authenticated
            if submitted_by:
                self.users[event.job_id] = submitted_by
        job = state.jobs.get(job_id) if job_id is not None else None
        if job is None:
            return []
        if isinstance(event, RankExited):
            return self._rank_exited(event, seq)
        return self._observe(before, job, seq, event, state)

    def _rank_exited(self, event: RankExited, seq: int) -> list[AttemptRecord]:
        rec = self.attempt(event.job_id, event.attempt)
        if rec is None or rec.ended_at is not None or event.exit_code == 0 or rec.failed_rank is not None:
            return []
        rec.failed_rank = event.rank
        rec.last_seq = seq
        return [rec]

    def apply_stored(self, state: ClusterState, seq: int, item: Event | Quarantined) -> list[AttemptRecord]:
        if isinstance(item, Quarantined):
            state.apply_stored(seq, item)
            return []
        return self.apply(state, seq, item)

    def _observe(
        self, before: tuple[str, int], job: JobView, seq: int, event: Event, state: ClusterState
    ) -> list[AttemptRecord]:
        was, was_attempt = before
        changed: list[AttemptRecord] = []
        if was in LAUNCHED and (job.state not in LAUNCHED or job.attempt != was_attempt):
            ended = self.attempt(job.job_id, was_attempt)
            if ended is not None and ended.ended_at is None:
                _close(ended, event, seq, state)
                changed.append(ended)
        if job.attempt != was_attempt and job.state in LAUNCHED:
            opened = AttemptRecord(
                job_id=job.job_id,
                attempt=job.attempt,
                team=job.spec.team,
                user=user_of(job, self.users.get(job.job_id)),
                priority=job.spec.priority,
                gpus=job.bound_gpus,
                gpu_milli=_part_milli(job),
                placements=job.placements,
                bound_at=job.bound_at if job.bound_at is not None else getattr(event, "at", 0.0),
                last_seq=seq,
            )
            self.jobs.setdefault(job.job_id, []).append(opened)
            changed.append(opened)
        elif was == "bound" and job.state == "running" and job.attempt == was_attempt:
            started = self.attempt(job.job_id, job.attempt)
            if started is not None:
                started.started_at = job.started_at
                started.resume_step = job.resume_step
                started.outcome = "running"
                started.last_seq = seq
                changed.append(started)
        return changed

    def attempt(self, job_id: str, attempt: int) -> AttemptRecord | None:
        for rec in reversed(self.jobs.get(job_id, ())):
            if rec.attempt == attempt:
                return rec
        return None

    def of(self, job_id: str) -> list[AttemptRecord]:
        return list(self.jobs.get(job_id, ()))

    def records(self) -> Iterator[AttemptRecord]:
        """Every attempt in (job id, attempt) order: the order every sum over them runs in."""
        for job_id in sorted(self.jobs):
            yield from sorted(self.jobs[job_id], key=lambda r: r.attempt)


def _close(rec: AttemptRecord, event: Event, seq: int, state: ClusterState) -> None:
    rec.ended_at = float(getattr(event, "at", 0.0))
    rec.outcome = outcome_of(event, rec.nodes, state)
    rec.reason = str(getattr(event, "reason", "") or "")
    rec.exit_code = getattr(event, "exit_code", None)
    rec.lost_gpu_s = float(getattr(event, "lost_gpu_s", 0.0))
    if isinstance(event, JobPreempted):
        rec.preempted_for = event.for_job
    if rec.exit_code is None:
        rec.failed_rank = None  # no rank's exit ended it (a preemption, a lost node, a time limit, ...)
    rec.last_seq = seq


def outcome_of(event: Event, nodes: Iterable[str], state: ClusterState) -> str:
    """How the attempt on ``nodes`` that ``event`` ended, ended (``state``: the fold once it applied it)."""
    if isinstance(event, JobInterrupted):
        nodes = event.failed_nodes  # the nodes it left; the healthy ones keep the gang
    elif not (isinstance(event, JobAttemptFailed) and event.cause == "infra"):
        return OUTCOMES.get(type(event).__name__, "ended")
    return DRAINED if any(_taken_out(state.nodes.get(n)) for n in nodes) else INTERRUPTED


def _taken_out(node: NodeView | None) -> bool:
    """Out of service and still there: drained or cordoned, not lost."""
    return node is not None and node.status != "lost" and (node.status == "drained" or node.cordoned)


def fold_attempts(events: Iterable[tuple[int, Event | Quarantined]]) -> tuple[ClusterState, AttemptLedger]:
    """The fold and every attempt, from (seq, event) pairs in log order."""
    state, ledger = ClusterState(), AttemptLedger()
    for seq, event in events:
        ledger.apply_stored(state, seq, event)
    return state, ledger
