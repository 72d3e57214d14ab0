"""GET /v1/jobs/{job_id}/why (``rally why JOB``): why a job waits, in numbers, and since when.

The answer joins three things the API already holds: the job's current pending reason (the fold's, as
the scheduler last wrote it), the reason history (the job's ``JobPending`` events, read from the log as
``rally show`` reads them: when each reason started and what ended it) and, for a pending job, the core's
``explain`` of the fold's cluster under the queue file this API was given: free GPUs per type, quota
room, and what would let it start; and its ``predicted_start`` as the job views have it (the predictor
service's, docs/prediction.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web

from rallypoint.accounting.attempts import AttemptRecord
from rallypoint.core import DEFAULT_PRIORITY_CLASSES, PriorityClass, Queue
from rallypoint.core.explain import Explanation, explain
from rallypoint.eventlog import EventLog
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs.history import ReasonChange, job_history
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.bridge import build_snapshot, pending_of
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import Queues
from rallypoint.state import ClusterState, JobView

from .auth import not_theirs
from .fold import FoldFollower
from .ledger import job_events
from .predictions import StartPredictions, render_predicted_start
from .problems import not_found
from .reads import FoldReads, document_fold_read
from .views import audience, pending_reason

READY_WAIT_S = 5.0  # how long the read waits for the fold to be current before 503 (as ApiConfig's)
_REF = "#/components/schemas/{name}"
_json = msgspec.json.Encoder()


class ReasonSpan(msgspec.Struct, kw_only=True):
    """One stretch of the job's wait under one reason code: from ``since`` to ``until`` (null: still its
    reason), ended by ``ended_by`` (``reason``: another code; ``bound``: the job was placed; ``ended``: it
    ended unplaced; empty while it lasts). ``message`` is the last one given under the code, ``updates``
    how many times its numbers were rewritten in between."""

    code: str
    message: str
    since: float
    until: float | None
    ended_by: str
    updates: int = 0


class Why(msgspec.Struct, kw_only=True):
    """``reason``: as ``GET /v1/jobs/{id}`` gives it (null unless pending); ``explanation``: the numbers,
    for a pending job only; ``history``: its reasons, oldest first; ``seq``: the fold's log position."""

    job_id: str
    state: str
    reason: dict[str, Any] | None
    explanation: Explanation | None
    history: list[ReasonSpan]
    predicted_start: dict[str, Any] | None = None
    seq: int


def reason_spans(
    reasons: Sequence[ReasonChange], attempts: Sequence[AttemptRecord], ended_at: float | None
) -> list[ReasonSpan]:
    """The job's reasons as spans: consecutive reasons of one code with no bind between are one span (its
    numbers changed); each span ends at the first of the next span, the next bind, the job's end."""
    binds = sorted(a.bound_at for a in attempts)
    spans: list[ReasonSpan] = []
    last_at = 0.0
    for change in reasons:
        last = spans[-1] if spans else None
        bound_between = any(last_at <= at <= change.at for at in binds)
        if last is not None and last.code == change.code and not bound_between:
            last.message, last.updates = change.message, last.updates + 1
        else:
            spans.append(
                ReasonSpan(code=change.code, message=change.message, since=change.at, until=None, ended_by="")
            )
        last_at = change.at
    for index, span in enumerate(spans):
        after = spans[index + 1] if index + 1 < len(spans) else None
        ends = [(at, "bound") for at in binds if at >= span.since][:1]
        if after is not None:
            ends.append((after.since, "reason"))
        if ended_at is not None and ended_at >= span.since:
            ends.append((ended_at, "ended"))
        if ends:
            span.until, span.ended_by = min(ends)
    return spans


class WhyHandlers:
    def __init__(
        self, log: EventLog, follower: FoldFollower, queues: Queues | None, predictions: StartPredictions
    ) -> None:
        self.log = log
        self.follower = follower
        self.predictions = predictions
        core: tuple[tuple[Queue, ...], tuple[PriorityClass, ...]] = (
            core_queues(queues) if queues is not None else ((), DEFAULT_PRIORITY_CLASSES)
        )
        self.queues, self.classes = core
        # the rules the local cluster's and the services' scheduler run by default (rallypoint)
        self.policy = SchedulingPolicy(queues=self.queues, priority_classes=self.classes).policy

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    def explanation(self, job: JobView) -> Explanation | None:
        """The core's numbers for a job that waits for the scheduler (none once placed or cancelled)."""
        if job.state != "pending" or job.cancel_requested:
            return None
        snapshot = build_snapshot(self.state, time.time(), queues=self.queues, priority_classes=self.classes)
        return explain(snapshot, pending_of(job), self.policy.config)

    async def why(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        job = self.state.jobs.get(job_id) if TOKEN_PATTERN.match(job_id) else None
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        reader = audience(request, self.state.jobs)
        # decided on the fold as it is now, before the log is read (the fold moves while this awaits)
        body = Why(
            job_id=job_id,
            state=job.state,
            reason=pending_reason(job, reader, self.state.hold_of(job)),
            explanation=self.explanation(job),
            history=[],
            seq=self.state.last_seq,
        )
        if job.state == "pending":
            body.predicted_start = render_predicted_start(job, await self.predictions.current())
        story = job_history(await job_events(self.log, job_id), job_id)
        if story is not None:
            body.history = reason_spans(story.reasons, story.attempts, story.ended_at)
        shown = body if reader.sees_all else reader.scrub(msgspec.to_builtins(body))
        return web.Response(body=_json.encode(shown), content_type="application/json")


def add_why_routes(
    app: web.Application,
    log: EventLog,
    follower: FoldFollower,
    queues: Queues | None,
    predictions: StartPredictions,
) -> None:
    handlers = WhyHandlers(log, follower, queues, predictions)
    reads = FoldReads(follower, READY_WAIT_S)
    app.router.add_get("/v1/jobs/{job_id}/why", reads(handlers.why, reads_log=True))


# --- the OpenAPI description, merged into the document by ``openapi.py`` -------------------------------


def why_schemas() -> dict[str, Any]:
    _, components = msgspec.json.schema_components([Why], ref_template=_REF)
    return components


def why_paths() -> dict[str, Any]:
    def problem(description: str) -> dict[str, Any]:
        schema = {"$ref": _REF.format(name="Problem")}
        return {"description": description, "content": {"application/problem+json": {"schema": schema}}}

    ok = {"application/json": {"schema": {"$ref": _REF.format(name="Why")}}}
    operation = {
        "operationId": "getJobWhy",
        "summary": "Why a job waits: its reason with the numbers behind it, what would let it start, and "
        "its reason history",
        "responses": {
            "200": {"description": "The explanation.", "content": ok},
            "404": problem("Unknown job."),
        },
    }
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/v1/jobs/{job_id}/why": {
            "parameters": [job_id],
            "get": document_fold_read(operation, problem, stale=False),
        }
    }
