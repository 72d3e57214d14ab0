"""``POST /v1/jobs?dry_run=true`` (``rally submit --dry-run``): a submission judged, nothing appended.

A dry run passes the submission's own checks first (``Handlers.submit``: body, token and team, validation,
an Idempotency-Key's earlier job with another spec), answering the same 4xx a submit would; then, here, the
admission a submit would get without the side effects: the team's priority ceiling, its fair-use limits on
a trial copy of this replica's ledger (no token taken, no admission recorded), and one cycle of the real
core (``schedule``) on a snapshot of this API's fold with the job added, as the scheduler's next cycle
would see it: placed (the nodes and GPUs), or its pending reason, or rejected (a reason the scheduler
rejects on, ``pending.NEVER_FITS``). The queue's quota numbers and what would let a waiting job start are
``rally why``'s (``core.explain``) on the same snapshot. Nothing is appended and no idempotency record or
secret is stored. The snapshot's model is kept in step with the fold by a ``ModelSync``, as the scheduler
keeps its own, so a dry run costs the difference since the last one plus one cycle.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import msgspec
from aiohttp import web

from rallypoint.core import DEFAULT_PRIORITY_CLASSES, PendingReason, PriorityClass, Queue, schedule
from rallypoint.core.explain import Explanation, QuotaRoom, explain
from rallypoint.core.types import Bind, PendingJob, Snapshot
from rallypoint.events import JobSpec, TaskPlacement
from rallypoint.runtime.changes import Changes, ChangeSet
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.bridge import pending_of, user_usage_of
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.pending import NEVER_FITS
from rallypoint.scheduling.queues import Queues
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState, JobView

from .fairuse import FairUse, Refusal
from .problems import problem
from .views import Audience

DRY_RUN_PARAM = "dry_run"
_FLAG_VALUES = {"true": True, "false": False}
_REF = "#/components/schemas/{name}"
_json = msgspec.json.Encoder()
#: The id a dry run without an Idempotency-Key is judged under: no job of the log can have it.
UNNAMED_JOB = "dry-run"
#: How long the snapshot of one log position is reused: dry runs in a burst share it; a dry run is judged
#: as of at most this long ago (the fold's moves, new jobs, ends, binds, take a new one at once).
SNAPSHOT_TTL_S = 1.0


class DryPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where the gang would bind at the next cycle: ``gpus`` in all, of ``gpu_type``, on ``nodes``, task by
    task (``tasks``: the node and the exact GPU indices of each)."""

    gpus: int
    gpu_type: str
    nodes: tuple[str, ...]
    tasks: tuple[TaskPlacement, ...]


class DryReason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why the job would not start now: the core's pending code and message (``jobs_ahead``: its place in
    the policy's order; ``earliest_start`` when a reservation computed one), or the refusal of admission
    (code ``PriorityNotAllowed`` naming ``field``, ``FairUse`` naming the queue file's ``limit`` and when
    to come back, or a code the scheduler rejects on: ``GangTooLarge``, ``Invalid``)."""

    code: str
    message: str
    jobs_ahead: int | None = None
    earliest_start: float | None = None
    field: str | None = None
    limit: str | None = None
    retry_after_s: int | None = None


class DryRun(msgspec.Struct, kw_only=True):
    """A dry run's answer. ``would_admit``: a submit now would be accepted and the job queued (placed or
    waiting); ``queue`` it would wait in and ``quota`` that queue's room for the GPU type it would use
    (null: an unlimited queue); ``placement`` at the next cycle, else ``reason``; ``explanation``: what
    would let a waiting job start (``rally why``'s numbers); ``job_id``: the id an Idempotency-Key gives
    (null without one); ``predicted_start``: when it would start (the predictor's run forward with the job
    submitted now; ``status`` ``now`` when it would be placed at the next cycle, ``unavailable`` without a
    predictor, null when it would not be admitted);
    ``log_position``: the fold's sequence the answer was computed at."""

    would_admit: bool
    job_id: str | None
    queue: str | None
    quota: QuotaRoom | None
    placement: DryPlacement | None
    reason: DryReason | None
    explanation: Explanation | None
    predicted_start: dict[str, Any] | None = None
    log_position: int


def dry_run_flag(request: web.Request) -> bool | web.Response:
    """The ``dry_run`` query parameter: ``true`` or ``false`` (absent: false), else a 400 naming it."""
    value = request.query.get(DRY_RUN_PARAM)
    if value is None:
        return False
    flag = _FLAG_VALUES.get(value.lower())
    if flag is None:
        return problem(
            400,
            "Invalid query parameter",
            f"dry_run must be true or false, got {value!r}",
            slug="invalid-query",
            field=DRY_RUN_PARAM,
        )
    return flag


def trial_fair_use(fair_use: FairUse, who: Principal, team: str, state: ClusterState) -> Refusal | None:
    """What ``fair_use.admit`` would answer now, decided on a copy of the team's bucket and of the
    admissions in flight, so the real ledger keeps every token and records nothing."""
    trial = FairUse(fair_use.queues, clock=fair_use.clock)
    if (bucket := fair_use.buckets.get(team)) is not None:
        trial.buckets[team] = copy.copy(bucket)
    trial.admitted = dict(fair_use.admitted)
    return trial.admit(who, team, UNNAMED_JOB, state)


def _admission_reason(priority_refusal: str | None, fair_use: Refusal | None) -> DryReason | None:
    if priority_refusal is not None:
        return DryReason(code="PriorityNotAllowed", message=priority_refusal, field="priority")
    if fair_use is not None:
        return DryReason(
            code="FairUse",
            message=fair_use.detail,
            limit=fair_use.limit,
            retry_after_s=fair_use.retry_after_s,
        )
    return None


def _core_reason(reason: PendingReason) -> DryReason:
    return DryReason(
        code=reason.code,
        message=reason.message,
        jobs_ahead=reason.position,
        earliest_start=reason.earliest_start,
    )


def _placement(bind: Bind, state: ClusterState) -> DryPlacement:
    nodes = tuple(dict.fromkeys(p.node_id for p in bind.placements))
    return DryPlacement(
        gpus=bind.gpus,
        gpu_type=state.nodes[nodes[0]].gpu_type,
        nodes=nodes,
        tasks=bind.placements,
    )


def _quota_of(explanation: Explanation, gpu_type: str | None) -> QuotaRoom | None:
    """The quota row of the type it binds on, else of its first type (its preference)."""
    rows = explanation.quotas
    return next((q for q in rows if q.gpu_type == gpu_type), rows[0] if rows else None)


class DryRuns:
    """The scheduler's view of this API's fold, for dry runs: the queue file's queues and classes under
    the rallypoint policy's rules (what ``rally why`` explains with), a model kept in step with the fold
    and the snapshot of the last log position judged at.

    ``follower``: the fold's own, whose change feed (opened at the first dry run) lets the model be synced
    from what the events touched since the last dry run, as the scheduler syncs its own, instead of
    comparing 12,500 nodes and every running job each time."""

    def __init__(self, queues: Queues | None, follower: Follower | None = None) -> None:
        core: tuple[tuple[Queue, ...], tuple[PriorityClass, ...]] = (
            core_queues(queues) if queues is not None else ((), DEFAULT_PRIORITY_CLASSES)
        )
        self.policy = SchedulingPolicy(queues=core[0], priority_classes=core[1])
        self._follower = follower
        self._changes: ChangeSet | None = None
        self._cached: tuple[ClusterState, int, Snapshot] | None = None

    def snapshot(self, state: ClusterState, now: float) -> Snapshot:
        """The snapshot a cycle would decide on: the one of this log position when it is at most
        ``SNAPSHOT_TTL_S`` old (its ``now`` with it), else one taken now. Its model is this object's and
        stays valid until the fold moves and a dry run syncs it again (there is no await in between)."""
        if (cached := self._cached) is not None and self._still_valid(cached, state, now):
            return cached[2]
        snapshot = self.policy.model_sync.snapshot(
            state,
            now,
            queues=self.policy.queues,
            priority_classes=self.policy.priority_classes,
            changed=self._touched(state),
        )
        self._cached = (state, state.last_seq, snapshot)
        return snapshot

    @staticmethod
    def _still_valid(cached: tuple[ClusterState, int, Snapshot], state: ClusterState, now: float) -> bool:
        taken_from, seq, snapshot = cached
        return taken_from is state and seq == state.last_seq and 0 <= now - snapshot.now <= SNAPSHOT_TTL_S

    def _touched(self, state: ClusterState) -> Changes | None:
        """What the fold's events touched since the last sync, when ``state`` is the follower's fold
        (None: compare everything)."""
        if self._follower is None or state is not self._follower.state:
            return None
        if self._changes is None:
            self._changes = self._follower.changes()  # its first take says: everything
        return self._changes.take()

    def judge(
        self,
        state: ClusterState,
        spec: JobSpec,
        *,
        job_id: str | None,
        refused: DryReason | None,
        now: float,
        user: str | None = None,
    ) -> DryRun:
        """The answer for ``spec`` on ``state``: ``refused`` is admission's refusal, if any; else the
        next cycle with the job added decides where it binds or why it waits. ``user``: who would submit
        it (fair share between the team's users weighs their usage, as it would the submitted job's)."""
        snapshot = self.snapshot(state, now)
        view = JobView(
            job_id=job_id or UNNAMED_JOB,
            spec=spec,
            submitted_at=snapshot.now,  # the moment the rest of the snapshot is of
            submitted_seq=state.last_seq + 1,
            user=user,
        )
        job = pending_of(view)
        if user is not None:  # the user's usage row, which the snapshot has only if they have jobs waiting
            rows = user_usage_of(state, (*snapshot.pending, job), snapshot.now)
            snapshot = msgspec.structs.replace(snapshot, user_usage=rows)
        explanation = explain(snapshot, job, self.policy.policy.config)
        answer = DryRun(
            would_admit=refused is None,
            job_id=job_id,
            queue=job.queue_name,
            quota=_quota_of(explanation, job.gpu_type),
            placement=None,
            reason=refused,
            explanation=explanation,
            log_position=state.last_seq,
        )
        if refused is None:
            self._decide(answer, snapshot, job, state)
        return answer

    def _decide(self, answer: DryRun, snapshot: Snapshot, job: PendingJob, state: ClusterState) -> None:
        decisions = schedule(
            msgspec.structs.replace(snapshot, pending=(*snapshot.pending, job)), self.policy.policy
        )
        bind = next((b for b in decisions.binds if b.job_id == job.id), None)
        if bind is not None:
            answer.placement = _placement(bind, state)
            answer.quota = (
                _quota_of(answer.explanation, answer.placement.gpu_type) if answer.explanation else None
            )
            answer.explanation = None  # it starts: nothing it lacks
            return
        reason = next(r for r in decisions.pending if r.job_id == job.id)
        answer.reason = _core_reason(reason)
        answer.would_admit = reason.code not in NEVER_FITS


def already_submitted(job: JobView, log_position: int) -> DryRun:
    """The answer when the Idempotency-Key's job is in the log with the same spec: a submit would create
    nothing (202, ``Idempotent-Replayed``), so it says which job that is."""
    return DryRun(
        would_admit=True,
        job_id=job.job_id,
        queue=job.queue or job.spec.team,
        quota=None,
        placement=None,
        reason=DryReason(
            code="AlreadySubmitted",
            message=f"job {job.job_id} was submitted with this Idempotency-Key and is {job.state}; "
            "a submit would create nothing",
        ),
        explanation=None,
        log_position=log_position,
    )


def dry_run_response(answer: DryRun, reader: Audience) -> web.Response:
    """200 with the answer; a team token's copy names no other team's job (as ``rally why``'s) but its
    own id, which no fold holds yet."""
    own = frozenset({"job_id"})
    shown: Any = answer if reader.sees_all else reader.scrub(msgspec.to_builtins(answer), keep=own)
    return web.Response(body=_json.encode(shown), content_type="application/json")


def judge_submission(
    runs: DryRuns,
    state: ClusterState,
    spec: JobSpec,
    *,
    job_id: str | None,
    who: Principal,
    priority_refusal: str | None,
    fair_use: FairUse,
) -> DryRun:
    """Admission (the priority ceiling, then fair use on a trial copy), then the core."""
    refused = _admission_reason(priority_refusal, trial_fair_use(fair_use, who, spec.team, state))
    return runs.judge(state, spec, job_id=job_id, refused=refused, now=time.time(), user=who.user)


# --- the OpenAPI description, merged into the document by ``openapi.py`` -------------------------------


def dry_run_schemas() -> dict[str, Any]:
    _, components = msgspec.json.schema_components([DryRun], ref_template=_REF)
    return components


def dry_run_parameter() -> dict[str, Any]:
    return {
        "name": DRY_RUN_PARAM,
        "in": "query",
        "required": False,
        "schema": {"type": "boolean", "default": False},
        "description": "true: append nothing; answer 200 with what the submission would meet (admission, "
        "queue, quota, placement at the next cycle or the pending reason). Bad input gets the same 4xx as "
        "a submit.",
    }


def dry_run_ok() -> dict[str, Any]:
    return {
        "description": "Dry run (dry_run=true): what the submission would meet; nothing was appended.",
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="DryRun")}}},
    }
