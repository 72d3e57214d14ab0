"""One job's whole story (``rally show JOB``, like ``scontrol show job``): pure, from events in log order.

The fold keeps only the current attempt, so ``job_history`` folds the events it is given with the
``AttemptLedger`` and keeps, for one job: every attempt with its placements and times, each pending reason
with when it was given, its checkpoints, the recovery steps (failures, interruptions, repairs, requeues)
and the preemptions with the job they made room for. It needs the job's own events plus the node and
leader-epoch events (the fold only accepts a decision of the current leader on GPUs that exist); other
jobs' events may be included and change nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from rallypoint.accounting.attempts import AttemptLedger, AttemptRecord
from rallypoint.events import (
    Event,
    GangRepaired,
    JobAttemptFailed,
    JobCancelRequested,
    JobInterrupted,
    JobPending,
    JobPreempted,
    JobRequeued,
    PreemptionRequested,
    event_type,
)
from rallypoint.events.codec import Quarantined
from rallypoint.events.subjects import members
from rallypoint.state import DECISION_ROLES, CheckpointView, ClusterState, JobView

# Every scheduler decision, whichever kinds the fold knows: the fold may refuse each of them.
_DECISIONS = tuple(DECISION_ROLES)

#: The states the fold's ``JobView.reason`` explains: why the job waits again (a retry, a requeue), is
#: being repaired, or ended as it did. Once the job runs again (or completes) the same text is the story
#: of its last interruption, not a reason for where it stands.
_STATES_WITH_REASON = frozenset({"pending", "repairing", "failed", "cancelled", "rejected"})


def current_reason(job: JobView) -> tuple[str, str]:
    """(the reason for the job's current state, the last interruption's reason): one of them is empty."""
    if job.state in _STATES_WITH_REASON:
        return job.reason, ""
    return "", job.reason


class ReasonChange(msgspec.Struct, kw_only=True):
    seq: int
    at: float
    code: str
    message: str


class Preemption(msgspec.Struct, kw_only=True):
    attempt: int
    for_job: str
    reason: str
    requested_at: float | None = None
    preempted_at: float | None = None
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None


class RecoveryStep(msgspec.Struct, kw_only=True):
    """``attempt-failed`` (a rank failed; retried), ``interrupted`` (a node under the gang was lost),
    ``drained`` (a node under it was taken out of service), ``repaired`` (replacement nodes found:
    ``swaps``), ``requeued`` (none found in time)."""

    seq: int
    at: float
    kind: str
    attempt: int
    reason: str = ""
    failed_nodes: list[str] = []
    swaps: list[dict[str, Any]] = []
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None


class TimelineEntry(msgspec.Struct, kw_only=True):
    seq: int
    at: float | None
    type: str
    #: False: the fold refused it (a stale leader's decision, one overtaken by a cancel...)
    applied: bool = True


class JobHistory(msgspec.Struct, kw_only=True):
    job_id: str
    spec: dict[str, Any]
    state: str
    queue: str | None
    submitted_at: float
    ended_at: float | None
    exit_code: int | None
    #: why the job is in its current state (empty once it runs again: see ``last_interruption``)
    reason: str
    cancel_requested_by: str | None
    #: why the cancel was asked for, when the cluster asked (an interactive session gone or idle)
    cancel_reason: str | None
    attempts: list[AttemptRecord]
    reasons: list[ReasonChange]
    checkpoints: list[CheckpointView]
    recovery: list[RecoveryStep]
    preemptions: list[Preemption]
    lost_gpu_s: float
    timeline: list[TimelineEntry]
    seq: int
    #: the reason of the interruption the job has since recovered from (a lost node, a drain)
    last_interruption: str = ""
    #: its plan on a node being drained under it: the API's ``render_job_drain``, from the live fold
    drain: dict[str, Any] | None = None


def _at(event: Event) -> float | None:
    at = getattr(event, "at", None)
    if at is None:
        at = getattr(event, "submitted_at", None)
    return float(at) if at is not None else None


class _Story:
    def __init__(self, job_id: str, ledger: AttemptLedger) -> None:
        self.job_id = job_id
        self.ledger = ledger
        self.reasons: list[ReasonChange] = []
        self.recovery: list[RecoveryStep] = []
        self.preemptions: list[Preemption] = []
        self.timeline: list[TimelineEntry] = []
        self.cancel_by: str | None = None
        self.cancel_reason: str | None = None

    def record(self, seq: int, event: Event, applied: bool) -> None:
        self.timeline.append(TimelineEntry(seq=seq, at=_at(event), type=event_type(event), applied=applied))
        if not applied:
            return
        if isinstance(event, JobPending):
            self.reasons.append(ReasonChange(seq=seq, at=event.at, code=event.code, message=event.message))
        elif isinstance(event, PreemptionRequested):
            self.preemptions.append(
                Preemption(
                    attempt=event.attempt, for_job=event.for_job, reason=event.reason, requested_at=event.at
                )
            )
        elif isinstance(event, JobPreempted):
            self._preempted(event)
        elif isinstance(event, JobCancelRequested):
            self.cancel_by = event.requested_by
            self.cancel_reason = event.reason
        elif isinstance(event, JobAttemptFailed | JobInterrupted | GangRepaired | JobRequeued):
            self.recovery.append(_recovery_step(seq, event, self._ended_as(seq, event)))

    def _ended_as(self, seq: int, event: Event) -> str:
        """How the attempt ``event`` ended at ``seq`` ended, as the ledger closed it (``outcome_of``:
        drained, interrupted, attempt-failed); ``interrupted`` for an attempt the ledger never opened."""
        record = self.ledger.attempt(self.job_id, getattr(event, "attempt", 0))
        if record is not None and record.ended_at is not None and record.last_seq == seq:
            return record.outcome
        return "interrupted"

    def _preempted(self, event: JobPreempted) -> None:
        for item in self.preemptions:
            if item.attempt == event.attempt and item.preempted_at is None:
                break
        else:  # stopped without a request in the log (an older writer): still one preemption
            item = Preemption(attempt=event.attempt, for_job=event.for_job, reason=event.reason)
            self.preemptions.append(item)
        item.preempted_at = event.at
        item.lost_gpu_s = event.lost_gpu_s
        item.checkpoint_step = event.checkpoint_step


def _recovery_step(
    seq: int, event: JobAttemptFailed | JobInterrupted | GangRepaired | JobRequeued, ended_as: str
) -> RecoveryStep:
    if isinstance(event, GangRepaired):
        swaps = [msgspec.to_builtins(s) for s in event.swaps]
        return RecoveryStep(seq=seq, at=event.at, kind="repaired", attempt=event.attempt, swaps=swaps)
    if isinstance(event, JobRequeued):
        return RecoveryStep(seq=seq, at=event.at, kind="requeued", attempt=event.attempt, reason=event.reason)
    failed = list(event.failed_nodes) if isinstance(event, JobInterrupted) else []
    return RecoveryStep(
        seq=seq,
        at=event.at,
        kind=ended_as,
        attempt=event.attempt,
        reason=event.reason,
        failed_nodes=failed,
        lost_gpu_s=event.lost_gpu_s,
        checkpoint_step=event.checkpoint_step,
    )


def _applied(state: ClusterState, seq: int, event: Event) -> bool:
    """Whether the fold acted on a decision (it stamps the job's ``last_seq`` only then)."""
    if not isinstance(event, _DECISIONS):
        return True
    job = state.jobs.get(getattr(event, "job_id", ""))
    return job is not None and job.last_seq == seq


def job_history(events: Iterable[tuple[int, Event | Quarantined]], job_id: str) -> JobHistory | None:
    """The history of ``job_id`` from (seq, event) pairs in log order; None when it was never submitted."""
    state, ledger = ClusterState(), AttemptLedger()
    story = _Story(job_id, ledger)
    for seq, stored in events:
        ledger.apply_stored(state, seq, stored)
        if isinstance(stored, Quarantined):
            continue
        for event in members(stored):  # a GangsBound's binds, each the job's own
            if getattr(event, "job_id", None) == job_id:
                story.record(seq, event, _applied(state, seq, event))
    job = state.jobs.get(job_id)
    if job is None:
        return None
    reason, last_interruption = current_reason(job)
    return JobHistory(
        job_id=job_id,
        spec=msgspec.to_builtins(job.spec),
        state=job.state,
        queue=job.queue,
        submitted_at=job.submitted_at,
        ended_at=job.ended_at,
        exit_code=job.exit_code,
        reason=reason,
        last_interruption=last_interruption,
        cancel_requested_by=story.cancel_by,
        cancel_reason=story.cancel_reason,
        attempts=ledger.of(job_id),
        reasons=story.reasons,
        checkpoints=list(job.checkpoints),
        recovery=story.recovery,
        preemptions=story.preemptions,
        lost_gpu_s=job.lost_gpu_s,
        timeline=story.timeline,
        seq=state.last_seq,
    )
