"""The commands people reach for, served from the log: a job's history (``scontrol show job``), finished
jobs (``sacct``), usage (``sreport``), queues (``kueuectl``) and rank logs (through the node agents).

Every answer is a pure function of the log (``rallypoint.accounting``, ``rallypoint.jobs.history``); the
JSON shapes are those structs', which the CLI prints with ``-o json`` unchanged.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import msgspec
from aiohttp import web

from rallypoint.accounting import GROUP_BY, AttemptRecord, FinishedJob, finished_jobs, queues_report, usage
from rallypoint.accounting.attempts import AttemptLedger
from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, DrainPolicy, job_drain
from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs.history import job_history
from rallypoint.protocol import LogsReply, LogsRequest
from rallypoint.state import TERMINAL, ClusterState, JobView

from .auth import forbidden, not_theirs, principal
from .fold import FoldFollower
from .ledger import LedgerCache, job_events
from .problems import not_found, problem, unavailable
from .reads import FoldReads, refuses_stale
from .usage_history import usage_history
from .views import EVERYONE, audience, render_job_drain

AGENT_TIMEOUT_S = 3.0
READY_WAIT_S = 5.0  # how long a read waits for the fold to be current before 503 (as ApiConfig's)
DEFAULT_LOG_CHUNK = 64 * 1024
_json = msgspec.json.Encoder()


def _ok(body: Any) -> web.Response:
    return web.Response(body=_json.encode(body), content_type="application/json")


def _shown(request: web.Request, jobs: Any, body: msgspec.Struct) -> web.Response:
    """``body`` as the caller may see it: another team's job ids in it (the job a preemption made room
    for, a pending reason naming its victims) redacted for a team token (``views.Audience``)."""
    reader = audience(request, jobs)
    return _ok(body if reader.sees_all else reader.scrub(msgspec.to_builtins(body)))


def _invalid(field: str, detail: str) -> web.Response:
    return problem(400, "Invalid query parameter", detail, slug="invalid-query", field=field)


class LogChunk(msgspec.Struct, kw_only=True):
    """A piece of a rank's log (GET /v1/jobs/{id}/logs): ask again from ``next_offset`` for more;
    ``eof`` once the attempt is over and everything its rank wrote was read."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    found: bool
    offset: int
    next_offset: int
    size: int
    text: str
    attempt_ended: bool
    eof: bool
    #: the rank whose non-zero exit failed (or, while its gang stops, is failing) the attempt: the default
    #: ``rank``; null when no rank's exit did
    failed_rank: int | None = None


class FinishedJobs(msgspec.Struct, kw_only=True):
    jobs: list[FinishedJob]
    count: int
    total: int
    seq: int


class BadParam(Exception):
    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail


def time_param(query: Any, name: str) -> float | None:
    """Seconds since the epoch, or an ISO 8601 time (UTC unless it names a zone)."""
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise BadParam(name, f"{name} must be epoch seconds or an ISO 8601 time, got {raw!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def int_param(query: Any, name: str, default: int | None, *, minimum: int = 0) -> int | None:
    raw = query.get(name)
    if raw is None:  # an empty value is not an integer: refused, as the document says
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(name, f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadParam(name, f"{name} must be at least {minimum}")
    return value


def default_rank(record: AttemptRecord) -> int:
    """The rank whose log a user wants when naming none: the one whose exit failed the attempt, else 0."""
    return record.failed_rank if record.failed_rank is not None else 0


def rank_node(job: JobView, placements: Any, rank: int) -> str | None:
    """The node that runs ``rank``: ranks are numbered task-major (``jobs.launch``)."""
    task = rank // job.spec.ranks_per_task
    for placement in placements:
        if placement.task == task:
            return str(placement.node_id)
    return None


class HistoryHandlers:
    def __init__(
        self,
        log: EventLog,
        follower: FoldFollower,
        queues: Any = None,
        drain: DrainPolicy = DEFAULT_DRAIN_POLICY,
    ) -> None:
        self.log = log
        self.follower = follower
        self.queues = queues
        self.drain = drain
        self.cache = LedgerCache(log)

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    async def _job(self, request: web.Request) -> tuple[str, JobView | None, web.Response | None]:
        # The route already waited until the fold held every acknowledged write (``FoldReads``).
        job_id = request.match_info["job_id"]
        job = self.state.jobs.get(job_id) if TOKEN_PATTERN.match(job_id) else None
        if job is None:
            return job_id, None, not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return job_id, None, refused
        return job_id, job, None

    # -- GET /v1/jobs/{job_id}/history -------------------------------------------------------------

    async def job_history(self, request: web.Request) -> web.Response:
        job_id, job, refused = await self._job(request)
        if refused is not None or job is None:
            return refused or not_found("job", job_id)
        history = job_history(await job_events(self.log, job_id), job_id)
        if history is None:
            return not_found("job", job_id)
        # the drain plan is the live fold's (its nodes and the policy), not the job's own events'
        history.drain = render_job_drain(job_drain(job, self.state, self.drain), EVERYONE)
        return _shown(request, self.state.jobs, history)

    # -- GET /v1/history ---------------------------------------------------------------------------

    async def finished(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            since, until = time_param(query, "since"), time_param(query, "until")
            limit = int_param(query, "limit", 1000, minimum=1)
        except BadParam as bad:
            return _invalid(bad.field, bad.detail)
        states = None
        if query.get("state"):
            states = {s.strip() for s in query["state"].split(",") if s.strip()}
            if unknown := sorted(states - TERMINAL):
                return _invalid(
                    "state", f"unknown state {unknown[0]!r}; one of {', '.join(sorted(TERMINAL))}"
                )
        team, refused = _team_scope(request, query.get("team") or None)
        if refused is not None:
            return refused
        state, ledger = await self.cache.current()
        rows = finished_jobs(state, ledger, team=team, since=since, until=until, states=states)
        shown = rows[-limit:] if limit is not None else rows
        body = FinishedJobs(jobs=shown, count=len(shown), total=len(rows), seq=state.last_seq)
        return _shown(request, state.jobs, body)

    # -- GET /v1/usage -----------------------------------------------------------------------------

    async def usage(self, request: web.Request) -> web.Response:
        query = request.query
        by = query.get("by", "team")
        if by not in GROUP_BY:
            return _invalid("by", f"by must be one of {', '.join(GROUP_BY)}, got {by!r}")
        try:
            since, until = time_param(query, "since"), time_param(query, "until")
            price = float(query["price_per_gpu_hour"]) if "price_per_gpu_hour" in query else None
            now = time_param(query, "now")
        except BadParam as bad:
            return _invalid(bad.field, bad.detail)
        except ValueError:
            return _invalid("price_per_gpu_hour", "price_per_gpu_hour must be a number")
        team, refused = _team_scope(request, query.get("team") or None)
        if refused is not None:
            return refused
        _, ledger = await self.cache.current()
        nominals = self.queues.nominals() if self.queues is not None else None
        report = usage(
            _records_of(ledger, team),
            by,
            since,
            until,
            now=now if now is not None else time.time(),
            price_per_gpu_hour=price,
            nominals=nominals,
        )
        return _ok(report)

    # -- GET /v1/usage/history ---------------------------------------------------------------------

    async def usage_history(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            since, until = time_param(query, "since"), time_param(query, "until")
            step = int_param(query, "step", None, minimum=1)
        except BadParam as bad:
            return _invalid(bad.field, bad.detail)
        team, refused = _team_scope(request, query.get("team") or None)
        if refused is not None:
            return refused
        _, ledger = await self.cache.current()
        now = time.time()
        end = until if until is not None else now
        return _ok(usage_history(_records_of(ledger, team), since=since, until=end, step_s=step, now=now))

    # -- GET /v1/queues ----------------------------------------------------------------------------

    async def queues_view(self, request: web.Request) -> web.Response:
        report = queues_report(self.state, self.queues)
        who = principal(request)
        if not who.admin:  # a team token sees its own team's users; of the others only the counts
            for row in report.teams:
                if row.team != who.team:
                    row.users = []
        return _ok(report)

    # -- GET /v1/jobs/{job_id}/logs ----------------------------------------------------------------

    async def logs(self, request: web.Request) -> web.Response:
        job_id, job, refused = await self._job(request)
        if refused is not None or job is None:
            return refused or not_found("job", job_id)
        query = request.query
        # The fold mutates ``job`` in place while this handler awaits: decide on the attempt seen now.
        current = job.attempt
        try:
            asked_rank = int_param(query, "rank", None)
            attempt = int_param(query, "attempt", None, minimum=1) or current
            offset = int_param(query, "offset", 0) or 0
            limit = int_param(query, "limit", DEFAULT_LOG_CHUNK, minimum=1) or DEFAULT_LOG_CHUNK
        except BadParam as bad:
            return _invalid(bad.field, bad.detail)
        _, ledger = await self.cache.current()
        record = ledger.attempt(job_id, attempt)
        if record is None:
            if not job.terminal and (attempt == 0 or attempt >= current):
                # nothing placed yet (a pending job): `rally logs -f` waits and asks again
                detail = f"job {job_id} is {job.state}; no rank of it has been placed yet"
                return problem(409, "Not placed yet", detail, slug="not-placed", state=job.state)
            return problem(404, "No such attempt", f"job {job_id} has no attempt {attempt}", slug="not-found")
        rank = default_rank(record) if asked_rank is None else asked_rank
        node_id = rank_node(job, record.placements, rank)
        if node_id is None:
            return _invalid("rank", f"rank {rank} was not placed in attempt {attempt}")
        ask = LogsRequest(job_id=job_id, attempt=attempt, rank=rank, offset=offset, max_bytes=limit)
        try:
            msg = await self.log.nc.request(
                subjects.agent_command(node_id, "logs"), _json.encode(ask), timeout=AGENT_TIMEOUT_S
            )
            reply = msgspec.json.decode(msg.data, type=LogsReply)
        except Exception as exc:  # no responders, timeout, a garbled reply: the agent cannot answer now
            return unavailable(f"the agent of {node_id} did not answer for the log ({type(exc).__name__})")
        if not reply.ok:
            return problem(502, "Agent refused", reply.error, slug="agent-error", node_id=node_id)
        # Done when the attempt is over and everything its rank wrote has been read.
        ended = record.ended_at is not None or job.terminal or job.attempt != attempt
        chunk = LogChunk(
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            node_id=node_id,
            found=reply.found,
            offset=reply.offset,
            next_offset=reply.next_offset,
            size=reply.size,
            text=reply.text,
            attempt_ended=ended,
            eof=ended and reply.next_offset >= reply.size,
            failed_rank=record.failed_rank,
        )
        return _ok(chunk)


def _records_of(ledger: AttemptLedger, team: str | None) -> Iterator[AttemptRecord]:
    """Every attempt in (job id, attempt) order, or only ``team``'s."""
    records = ledger.records()
    return records if team is None else (r for r in records if r.team == team)


def _team_scope(request: web.Request, asked: str | None) -> tuple[str | None, web.Response | None]:
    """The team a request may see: an admin any (or all), a team token its own, another refused (403)."""
    who = principal(request)
    if who.admin:
        return asked, None
    if asked is not None and asked != who.team:
        return None, forbidden(f"this token acts for team {who.team!r}, not {asked!r}", field="team")
    return who.team, None


def add_history_routes(
    app: web.Application,
    log: EventLog,
    follower: FoldFollower,
    queues: Any = None,
    drain: DrainPolicy = DEFAULT_DRAIN_POLICY,
) -> None:
    handlers = HistoryHandlers(log, follower, queues, drain)
    reads = FoldReads(follower, READY_WAIT_S)
    # A job's history and logs find the job in the fold, then read the log (and an agent): no stale read.
    app.router.add_get("/v1/jobs/{job_id}/history", reads(handlers.job_history, reads_log=True))
    app.router.add_get("/v1/jobs/{job_id}/logs", reads(handlers.logs, reads_log=True))
    app.router.add_get("/v1/history", refuses_stale(handlers.finished))
    app.router.add_get("/v1/usage", refuses_stale(handlers.usage))
    app.router.add_get("/v1/usage/history", refuses_stale(handlers.usage_history))
    app.router.add_get("/v1/queues", reads(handlers.queues_view))  # the fold alone: stale reads too
