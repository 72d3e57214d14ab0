"""The aiohttp application: routes, submission and cancellation, queries over the fold.

Writes go to the log and are answered only once the log acknowledged them; reads come from this
instance's fold (``FoldFollower``), and wait until it holds every write the log had acknowledged when
the read began (``reads.FoldReads``), so a client reads its own write through any API replica; or, with
``?stale=true``, at once from whatever the fold holds (what an operator can still see while NATS is away).
Validation is ``rallypoint.jobs``; the only thing decided here is which HTTP status says what.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, get_args
from urllib.parse import parse_qsl

import msgspec
import nats.errors
from aiohttp import web
from prometheus_client import REGISTRY, generate_latest

from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, DrainPolicy, job_drain
from rallypoint.eventlog import AppendConflict, EventLog, LogUnavailable
from rallypoint.eventlog.log import Append
from rallypoint.eventlog.secretstore import SecretsConflict, SecretStore
from rallypoint.events import JobCancelRequested, JobSpec, JobSubmitted, subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs import (
    DEFAULT_MAX_GPUS_PER_NODE,
    DEFAULT_PRIORITY,
    PRIORITY_CLASSES,
    SpecError,
    check_fits_cluster,
    check_idempotency_key,
    job_id_for,
    new_job_id,
    validate_spec,
)
from rallypoint.jobs.arrays import ArrayRequest, members, parse_array
from rallypoint.jobs.text import check_strings, check_text
from rallypoint.jobs.validate import BodyError, check_checkpoint_dir, check_secrets, decode_json_body
from rallypoint.predict.refresh import Answer
from rallypoint.scheduling.queues import Queues
from rallypoint.security.tokens import Principal, TokenStore
from rallypoint.state import ClusterState, JobState, JobView
from rallypoint.state.dependencies import hold_code

from .arrays import accepted_array, append_array, existing_array
from .auth import auth_middleware, forbidden, not_theirs, principal
from .dashboard import add_dashboard_routes
from .dependencies import dependency_refusal, held_at_submit, with_array_members
from .dryrun import DryReason, DryRuns, already_submitted, dry_run_flag, dry_run_response, judge_submission
from .fairuse import FairUse, refusal_metrics, too_many
from .fold import FoldFollower, quarantine_metrics
from .history_views import add_history_routes
from .http_metrics import metrics_middleware
from .metrics import PROMETHEUS_CONTENT_TYPE, read_index_metrics, render_metrics
from .node_ops import add_node_routes
from .node_rules import add_node_rules_route
from .openapi import openapi_document
from .predictions import StartPredictions, add_predictions_route, render_predicted_start
from .problems import PROBLEM_JSON, invalid_spec, not_found, problem, unavailable, unparseable
from .readindex import ReadIndex, stream_tip
from .reads import FoldReads, ready_to_read
from .suspend import add_suspend_routes
from .terminal import add_terminal_routes
from .traced import trace_middleware
from .views import audience, job_links, queue_positions, render_checkpoints, render_job, render_node
from .why import add_why_routes

_log = logging.getLogger("rallypoint.api")

JSON = "application/json"
CLOUDEVENTS_JSON = "application/cloudevents+json"
CLOUDEVENTS_BATCH_JSON = "application/cloudevents-batch+json"
IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
JOB_STATES: frozenset[str] = frozenset(get_args(JobState))
MAX_LIST_LIMIT = 10_000
DEFAULT_LIST_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class ApiConfig:
    source: str = "rallypoint/api"  # CloudEvents source of what this service appends
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE  # used until a node has registered
    fold_wait_s: float = 2.0  # how long a write waits for the fold before answering anyway
    ready_wait_s: float = 5.0  # how long a read waits for the fold to be current before 503
    # the queue file the scheduler reads: its priority classes and default class, each team's max_priority,
    # its orgs (None: the built-in classes, every class for every team, any team name)
    queues: Queues | None = None
    # the cluster's checkpoint root: a job's checkpoint_dir must lie in <root>/<team>/ (None: none may)
    checkpoint_root: str | None = None
    # the job controller's drain policy (its --drain-policy): what the views say a draining gang will do
    drain: DrainPolicy = DEFAULT_DRAIN_POLICY


_json = msgspec.json.Encoder()


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=_json.encode(body), content_type="application/json", headers=headers
    )


def _unsupported_media_type(content_type: str) -> web.Response | None:
    """415 unless the body is labelled JSON: a form or text body (curl -d's default) is refused, not
    guessed at. Without a Content-Type header aiohttp reports application/octet-stream: refused too."""
    if content_type in (JSON, CLOUDEVENTS_JSON):
        return None
    if content_type == CLOUDEVENTS_BATCH_JSON:
        detail = (
            "CloudEvents batch mode is not supported; send one event per request (structured or binary mode)"
        )
    else:
        detail = (
            f"Content-Type {content_type!r} is not accepted; send the job spec as {JSON} "
            f"(or a CloudEvent as {CLOUDEVENTS_JSON})"
        )
    return problem(415, "Unsupported media type", detail, slug="unsupported-media-type")


class Handlers:
    def __init__(self, log: EventLog, follower: FoldFollower, config: ApiConfig) -> None:
        self.log = log
        self.predictions = StartPredictions(lambda: self.log.nc)
        self.follower = follower
        self.config = config
        self.submissions: Counter[str] = Counter()
        self.priority_classes, self.default_priority = submission_classes(config.queues)
        self.fair_use = FairUse(config.queues)
        self._secret_store: SecretStore | None = None  # opened at the first submission with secrets
        self.dry_runs = DryRuns(config.queues, follower.follower)  # ?dry_run=true: the core on this fold

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    async def _ready(self) -> web.Response | None:
        """503 unless the fold holds every write acknowledged before the request, by any replica: what a
        cancel's lookup waits for (the GETs are wrapped in ``FoldReads``, which also offers ``?stale``)."""
        return await ready_to_read(self.follower, self.config.ready_wait_s)

    # -- POST /v1/jobs -------------------------------------------------------------------------------

    async def submit(self, request: web.Request) -> web.Response:
        if isinstance(dry_run := dry_run_flag(request), web.Response):
            return dry_run
        if (refused := _unsupported_media_type(request.content_type.lower())) is not None:
            self.submissions["invalid"] += 1
            return refused
        try:
            decoded = decode_json_body(await request.read())
        except BodyError as err:
            self.submissions["invalid"] += 1
            return unparseable(err.detail, field=err.field)
        if decoded is None:
            self.submissions["invalid"] += 1
            return unparseable("body is empty; send a JSON job spec")

        key = request.headers.get(IDEMPOTENCY_KEY)
        if request.content_type.lower() == CLOUDEVENTS_JSON:
            try:
                payload, event_id = _unwrap_cloudevent(decoded)
            except SpecError as err:
                self.submissions["invalid"] += 1
                return invalid_spec(err)
            key = event_id if key is None else key
        else:
            payload = decoded
            # CloudEvents binary mode: the attributes ride in ce-* headers and the body is the spec.
            # An empty header is a key too (refused as one), not a missing one.
            key = request.headers.get("ce-id") if key is None else key
        who = principal(request)
        payload, refused = _team_from_token(payload, who)
        if refused is not None:
            self.submissions["forbidden"] += 1
            return refused

        # The initial replay only, not this instance's earlier writes: a submission is validated against
        # the cluster, and an earlier write of its own key is found by the log's expected sequence.
        if not await self.follower.wait_replayed(self.config.ready_wait_s):
            self.submissions["unavailable"] += 1
            return unavailable("the API is still replaying the event log; retry shortly")
        try:
            spec = self._validate(payload)
            secrets = check_secrets(payload, spec.env) if isinstance(payload, dict) else {}
            job_id = job_id_for(spec.team, check_idempotency_key(key)) if key is not None else new_job_id()
            array = (
                parse_array(payload.get("array"))
                if isinstance(payload, dict) and "array" in payload
                else None
            )
        except SpecError as err:
            self.submissions["invalid"] += 1
            return invalid_spec(err)
        # a dependency on a whole array waits for every member (before the key's replay check: the log
        # holds the expanded spec)
        expanded = await with_array_members(spec, who, lambda: self.state, self._ready)
        if isinstance(expanded, web.Response):
            return expanded
        spec = expanded
        if array is not None:
            return await self._submit_array(
                request, who, spec, job_id, key, array, dry_run=dry_run, secrets=secrets
            )
        if dry_run:
            return await self._dry_run(request, who, spec, job_id, key)
        if (refusal := self._priority_refusal(who, spec)) is not None:
            self.submissions["forbidden"] += 1
            self.fair_use.count_refusal(spec.team, "priority")
            return forbidden(refusal, field="priority")

        # A retry (the same key) must also send the same secret values: compared first, as a key already
        # stored means its job may be in the log, whose spec holds their names only.
        if secrets and key is not None and (refused := await self._secrets_refusal(job_id, secrets, key)):
            return refused
        existing = self.state.jobs.get(job_id)
        if existing is not None:
            return self._replayed(existing, spec, key)
        if (refused := await dependency_refusal(spec, who, lambda: self.state, self._ready)) is not None:
            self.submissions["invalid"] += 1
            return refused
        if (limited := await self._fair_use_refusal(who, spec, job_id, key)) is not None:
            return limited
        if secrets and (refused := await self._secrets_refusal(job_id, secrets, key, store=True)):
            self.fair_use.withdraw(job_id)
            return refused

        event = JobSubmitted(
            job_id=job_id, spec=spec, submitted_at=time.time(), idempotency_key=key, submitted_by=who.user
        )
        try:
            # Expected subject sequence 0: the server refuses a second JobSubmitted for this id.
            result = await self.log.append_ack(
                subjects.job(job_id),
                event,
                msg_id=f"{job_id}:0:JobSubmitted",
                source=self.config.source,
                expected_last_subject_seq=0,
            )
        except AppendConflict:
            # The job exists (a concurrent retry won, or the fold has not seen it yet): find it.
            return await self._replayed_after_conflict(job_id, spec, key)
        except LogUnavailable as exc:
            self.fair_use.withdraw(job_id)
            self.submissions["unavailable"] += 1
            return unavailable(
                f"the event log did not acknowledge the submission ({exc}); retry with the "
                "same Idempotency-Key to avoid a duplicate job"
            )

        self.follower.wrote(result.seq)
        if result.duplicate:
            # A retry whose first attempt landed, or a concurrent twin: this request created nothing, and
            # the stored job says whether it asked for the same spec.
            return await self._replayed_at(job_id, result.seq, spec, key)
        # Stored under expected sequence 0 and not a duplicate: this request created the job. Answered
        # without waiting for this instance's fold to apply it (reads wait for that: ``wait_caught_up``),
        # so the requests in flight do not queue behind the fold.
        self.submissions["accepted"] += 1
        return self._accepted(job_id, result.seq, self.state.jobs.get(job_id), replayed=False)

    async def _submit_array(
        self,
        request: web.Request,
        who: Principal,
        spec: JobSpec,
        array_id: str,
        key: str | None,
        array: ArrayRequest,
        *,
        dry_run: bool,
        secrets: dict[str, str],
    ) -> web.Response:
        """An array (``arrays.py``): a dry run answers for its first member; a submit appends them all."""
        if secrets:
            self.submissions["invalid"] += 1
            return invalid_spec(
                SpecError("secrets", "an array cannot have secrets yet; use env or one job each")
            )
        first_id, first_spec = members(array_id, spec, array)[0]
        if dry_run:
            return await self._dry_run(request, who, first_spec, first_id, key)
        if (refusal := self._priority_refusal(who, spec)) is not None:
            self.submissions["forbidden"] += 1
            return forbidden(refusal, field="priority")
        if (replayed := existing_array(self.state, array_id, array, spec)) is not None:
            return replayed
        if (refused := await dependency_refusal(spec, who, lambda: self.state, self._ready)) is not None:
            self.submissions["invalid"] += 1
            return refused
        if (limited := await self._fair_use_refusal(who, first_spec, first_id, key)) is not None:
            return limited
        landed = await append_array(self.log, array_id, spec, array, who, key, self.config.source)
        if isinstance(landed, web.Response):
            self.fair_use.withdraw(first_id)
            return landed
        self.follower.wrote(landed.last_seq)
        self.submissions["accepted"] += 1
        job_ids = [job_id for job_id, _ in members(array_id, spec, array)]
        return accepted_array(array_id, job_ids, landed.first_seq, replayed=landed.duplicate)

    async def _dry_run(
        self, request: web.Request, who: Principal, spec: JobSpec, job_id: str, key: str | None
    ) -> web.Response:
        """Past the checks above, a dry run appends nothing (``dryrun.py``); a key's earlier job gets the
        422 a submit would when its spec differs, and is named when it is the same. It reads the fold as
        a GET does: holding every write acknowledged before it, by any replica."""
        if (not_ready := await self._ready()) is not None:
            return not_ready
        reader = audience(request, self.state.jobs)
        if key is None:
            job_id_or_none = None
        elif (existing := self.state.jobs.get(job_id)) is not None:
            if existing.spec != spec:
                return self._replayed(existing, spec, key)
            return dry_run_response(already_submitted(existing, self.state.last_seq), reader)
        else:
            job_id_or_none = job_id
        if (refused := await dependency_refusal(spec, who, lambda: self.state, self._ready)) is not None:
            return refused
        answer = judge_submission(
            self.dry_runs,
            self.state,
            spec,
            job_id=job_id_or_none,
            who=who,
            priority_refusal=self._priority_refusal(who, spec),
            fair_use=self.fair_use,
        )
        if answer.would_admit and (held := held_at_submit(self.state, spec)) is not None:
            answer.placement = None
            answer.reason = DryReason(code=hold_code(held), message=held)
            answer.predicted_start = {"status": "unavailable", "detail": "it waits for its dependencies"}
        elif answer.placement is not None:
            answer.predicted_start = {"status": "now", "detail": "placed at the next cycle"}
        elif answer.would_admit:
            ahead = answer.reason.jobs_ahead if answer.reason is not None else None
            answer.predicted_start = await self.predictions.dry_run(spec, jobs_ahead=ahead)
        return dry_run_response(answer, reader)

    async def _secrets_refusal(
        self, job_id: str, secrets: dict[str, str], key: str | None, *, store: bool = False
    ) -> web.Response | None:
        """None when the job's secrets are stored (``store``) or match what its key stored before (or
        nothing was); else 409 naming ``secrets``, or 503 when the secrets store does not answer. Neither
        an answer nor a log line holds a value."""
        try:
            await self._keep_or_compare_secrets(job_id, secrets, store=store)
        except nats.errors.Error as exc:
            self.submissions["unavailable"] += 1
            _log.warning("job %s: the secrets store did not answer: %s", job_id, type(exc).__name__)
            return unavailable("the secrets store did not answer; retry with the same Idempotency-Key")
        except SecretsConflict:
            self.submissions["invalid"] += 1
            return problem(
                409,
                "Secrets differ",
                f"Idempotency-Key {key!r} was already used for job {job_id} with other secret values; "
                "use a new key for a new job",
                slug="secrets-differ",
                field="secrets",
                job_id=job_id,
            )
        return None

    async def _keep_or_compare_secrets(self, job_id: str, secrets: dict[str, str], *, store: bool) -> None:
        """Store the secrets, or compare them with the stored ones: ``SecretsConflict`` when they differ."""
        if self._secret_store is None:
            self._secret_store = await SecretStore.open(self.log.js)
        if store:
            await self._secret_store.store(job_id, secrets)  # a twin request may have stored others
        elif (stored := await self._secret_store.read(job_id)) is not None and stored != secrets:
            raise SecretsConflict(job_id)

    async def _replayed_at(self, job_id: str, seq: int, spec: JobSpec, key: str | None) -> web.Response:
        await self.follower.wait_for_seq(seq, self.config.fold_wait_s)
        job = self.state.jobs.get(job_id)
        if job is None:
            # Never a 202 for a job this instance's own GET would answer 404 for.
            return self._not_visible(job_id, seq)
        return self._replayed(job, spec, key)

    def _not_visible(self, job_id: str, seq: int) -> web.Response:
        self.submissions["unavailable"] += 1
        _log.error(
            "job %s appended at seq %d but not in this API's fold (at seq %d)",
            job_id,
            seq,
            self.state.last_seq,
        )
        return problem(
            503,
            "Submission not visible yet",
            f"job {job_id} was appended at seq {seq} but this API's view of the log has not reached it "
            f"(at seq {self.state.last_seq}); GET /v1/jobs/{job_id} shortly, or retry with the same "
            "Idempotency-Key",
            slug="not-visible",
            headers={"Retry-After": "2", "Location": f"/v1/jobs/{job_id}"},
            job_id=job_id,
            seq=seq,
        )

    async def _fair_use_refusal(
        self, who: Principal, spec: JobSpec, job_id: str, key: str | None
    ) -> web.Response | None:
        """429 beyond the team's pending cap or submission rate (``fairuse.py``), unless the request is
        the retry of a submission the log already holds: that one is answered as before, never 429."""
        refusal = self.fair_use.admit(who, spec.team, job_id, self.state)
        if refusal is None:
            return None
        if key is not None and (job := await self._in_log(job_id)) is not None:
            return self._replayed(job, spec, key)
        self.submissions["limited"] += 1
        return too_many(refusal)

    async def _in_log(self, job_id: str) -> JobView | None:
        """The job, once this instance's fold has read the log to its current end (None: not there)."""
        try:
            last = await self.log.last_seq()
        except LogUnavailable:
            return None
        await self.follower.wait_for_seq(last, self.config.fold_wait_s)
        return self.state.jobs.get(job_id)

    def _priority_refusal(self, who: Principal, spec: JobSpec) -> str | None:
        # An admin may submit above a team's ceiling (an operator's override, as a Slurm admin's QOS).
        if who.admin or self.config.queues is None:
            return None
        return self.config.queues.priority_refusal(spec.team, spec.priority)

    def _validate(self, payload: object) -> JobSpec:
        # The fold keeps the largest node and the total current as events arrive: a submission costs the
        # same at 4 nodes and at 12,500. Until a node registers nothing is known about the cluster:
        # validate shapes only.
        largest = self.state.largest_node_gpus()
        max_per_node = largest if largest is not None else self.config.max_gpus_per_node
        spec = validate_spec(
            payload,
            max_gpus_per_node=max_per_node,
            priority_classes=self.priority_classes,
            default_priority=self.default_priority,
        )
        if self.config.queues is not None:
            check_not_an_org(self.config.queues, spec.team)
        if largest is not None:
            check_fits_cluster(spec, self.state.total_gpus(), max_per_node)
        check_checkpoint_dir(spec, self.config.checkpoint_root)
        return spec

    async def _replayed_after_conflict(self, job_id: str, spec: JobSpec, key: str | None) -> web.Response:
        try:
            last = await self.log.last_seq()
        except LogUnavailable as exc:
            self.submissions["unavailable"] += 1
            return unavailable(str(exc))
        await self.follower.wait_for_seq(last, self.config.fold_wait_s)
        job = self.state.jobs.get(job_id)
        if job is None:
            # The log says the subject is taken but our fold cannot see why within the wait.
            self.submissions["unavailable"] += 1
            return unavailable(f"job {job_id} exists in the log but is not readable yet; retry")
        return self._replayed(job, spec, key)

    def _replayed(self, job: JobView, spec: JobSpec, key: str | None) -> web.Response:
        if job.spec != spec:
            # Same key, different request: answering 202 would hide that the new spec was never run.
            self.submissions["invalid"] += 1
            return problem(
                422,
                "Idempotency key reused",
                f"Idempotency-Key {key!r} was already used for job {job.job_id} with a different spec; "
                "use a new key for a new job",
                slug="idempotency-key-reused",
                field="idempotency_key",
                job_id=job.job_id,
            )
        self.submissions["replayed"] += 1
        return self._accepted(job.job_id, job.submitted_seq, job, replayed=True)

    def _accepted(self, job_id: str, seq: int, job: JobView | None, *, replayed: bool) -> web.Response:
        headers = {"Location": f"/v1/jobs/{job_id}"}
        if replayed:
            headers[IDEMPOTENT_REPLAYED] = "true"
        body = {
            "job_id": job_id,
            "seq": seq,
            "state": job.state if job is not None else "pending",
            "links": job_links(job_id),
        }
        return json_response(body, status=202, headers=headers)

    # -- jobs: read and cancel -------------------------------------------------------------------------

    def _lookup(self, request: web.Request) -> tuple[str, JobView | None]:
        job_id = request.match_info["job_id"]
        return job_id, self.state.jobs.get(job_id) if TOKEN_PATTERN.match(job_id) else None

    async def get_job(self, request: web.Request) -> web.Response:
        job_id, job = self._lookup(request)
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        reader = audience(request, self.state.jobs)
        drain = job_drain(job, self.state, self.config.drain)
        body = render_job(job, queue_positions(self.state), reader, drain, self.state.hold_of(job))
        body["predicted_start"] = render_predicted_start(job, await self._predicted_starts(job.state))
        return json_response(body)

    async def _predicted_starts(self, *states: str) -> Answer | None:
        """The predictor's latest answer when a job in ``states`` needs it (only waiting ones do)."""
        return await self.predictions.current() if "pending" in states else None

    async def list_jobs(self, request: web.Request) -> web.Response:
        query = request.query
        states: set[str] | None = None
        if query.get("state"):
            states = {s.strip() for s in query["state"].split(",") if s.strip()}
            unknown = sorted(states - JOB_STATES)
            if unknown:
                return problem(
                    400,
                    "Invalid query parameter",
                    f"unknown state {unknown[0]!r}; one of {', '.join(sorted(JOB_STATES))}",
                    slug="invalid-query",
                    field="state",
                )
        team = query.get("team") or None
        array_id = query.get("array") or None
        who = principal(request)
        if not who.admin:
            # A team token lists its own team's jobs; asking for another team's is refused, not emptied.
            if team is not None and team != who.team:
                return forbidden(f"this token acts for team {who.team!r}, not {team!r}", field="team")
            team = who.team
        try:
            limit = int(query.get("limit", DEFAULT_LIST_LIMIT))
            after = int(query.get("after", 0))
        except ValueError:
            return problem(
                400,
                "Invalid query parameter",
                "limit and after must be integers",
                slug="invalid-query",
                field="limit" if "limit" in query else "after",
            )
        if not 1 <= limit <= MAX_LIST_LIMIT:
            return problem(
                400,
                "Invalid query parameter",
                f"limit must be between 1 and {MAX_LIST_LIMIT}",
                slug="invalid-query",
                field="limit",
            )

        matching = sorted(
            (
                j
                for j in self.state.jobs.values()
                if j.submitted_seq > after
                and (states is None or j.state in states)
                and (team is None or j.spec.team == team)
                and (array_id is None or (j.spec.array is not None and j.spec.array.array_id == array_id))
            ),
            key=lambda j: j.submitted_seq,
        )
        page = matching[:limit]
        positions = queue_positions(self.state)
        reader = audience(request, self.state.jobs)
        answer = await self._predicted_starts(*{j.state for j in page})
        return json_response(
            {
                "jobs": [
                    {
                        **render_job(
                            j,
                            positions,
                            reader,
                            job_drain(j, self.state, self.config.drain),
                            self.state.hold_of(j),
                        ),
                        "predicted_start": render_predicted_start(j, answer),
                    }
                    for j in page
                ],
                "count": len(page),
                # Cursor for the next page: pass it back as ?after=; null when this page is the last.
                "next_after": page[-1].submitted_seq if len(matching) > limit else None,
                "seq": self.state.last_seq,
            }
        )

    async def get_checkpoints(self, request: web.Request) -> web.Response:
        """The job's checkpoints as the log tells them; ``latest_complete`` is what a restart resumes from."""
        job_id, job = self._lookup(request)
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        return json_response({**render_checkpoints(job), "seq": self.state.last_seq})

    async def cancel_job(self, request: web.Request) -> web.Response:
        if (not_ready := await self._ready()) is not None:
            return not_ready
        job_id, job = self._lookup(request)
        if job is None and (array := self._array_members(request, job_id)):
            return await self._cancel_array(request, job_id, array)
        if job is None:
            return not_found("job", job_id)
        if (refused := not_theirs(request, job)) is not None:
            return refused
        if job.terminal:
            return problem(
                409,
                "Job already finished",
                f"job {job_id} is already {job.state}; nothing to cancel",
                slug="job-terminal",
                state=job.state,
            )
        # Who asked comes from the token: a header such as X-Rally-User is whatever the caller typed.
        event = JobCancelRequested(job_id=job_id, at=time.time(), requested_by=principal(request).user)
        try:
            # One cancel per job: a second DELETE within the duplicate window is de-duplicated by the server.
            seq = await self.log.append(
                subjects.job(job_id), event, msg_id=f"{job_id}:cancel", source=self.config.source
            )
        except LogUnavailable as exc:
            return unavailable(f"the event log did not acknowledge the cancellation ({exc}); retry")
        self.follower.wrote(seq)
        await self.follower.wait_for_seq(seq, self.config.fold_wait_s)
        current = self.state.jobs.get(job_id, job)
        return json_response(
            {
                "job_id": job_id,
                "seq": seq,
                "state": current.state,
                "cancel_requested": True,
                "links": job_links(job_id),
            },
            status=202,
        )

    def _array_members(self, request: web.Request, array_id: str) -> list[JobView]:
        """The members of the array ``array_id`` the caller may act on, in index order (none: no such)."""
        if not TOKEN_PATTERN.match(array_id):
            return []
        found = [
            j
            for j in self.state.jobs.values()
            if j.spec.array is not None and j.spec.array.array_id == array_id
        ]
        found = [j for j in found if not_theirs(request, j) is None]
        return sorted(found, key=lambda j: j.spec.array.index if j.spec.array is not None else 0)

    async def _cancel_array(self, request: web.Request, array_id: str, array: list[JobView]) -> web.Response:
        """Cancel every member not ended yet, all at once (``DELETE /v1/jobs/{array id}``)."""
        who = principal(request).user
        now = time.time()
        # chosen before the append: the views are the fold's, which may apply the cancels while it waits
        cancelled = [j.job_id for j in array if not j.terminal and not j.cancel_requested]
        chosen = set(cancelled)
        entries = [
            Append(
                subject=subjects.job(j.job_id),
                event=JobCancelRequested(job_id=j.job_id, at=now, requested_by=who),
                msg_id=f"{j.job_id}:cancel",
            )
            for j in array
            if j.job_id in chosen
        ]
        if not entries:
            return problem(
                409, "Array already finished", f"every member of {array_id} has ended", slug="job-terminal"
            )
        try:
            landed = await self.log.append_batch(entries, source=self.config.source)
        except AppendConflict:  # a member's cancel landed meanwhile (its message id): the fold has it soon
            return problem(
                409, "Cancel under way", f"a member of {array_id} is being cancelled; retry", slug="retry"
            )
        except LogUnavailable as exc:
            return unavailable(f"the event log did not acknowledge the cancellation ({exc}); retry")
        self.follower.wrote(landed.last_seq)
        body = {"array_id": array_id, "job_ids": cancelled, "seq": landed.last_seq}
        return json_response({**body, "cancel_requested": True}, status=202)

    # -- cluster, state, operations --------------------------------------------------------------------

    async def list_nodes(self, request: web.Request) -> web.Response:
        reader = audience(request, self.state.jobs)
        nodes = [render_node(n, reader, self.config.drain) for _, n in sorted(self.state.nodes.items())]
        return json_response({"nodes": nodes, "count": len(nodes), "seq": self.state.last_seq})

    async def get_state(self, request: web.Request) -> web.Response:
        return json_response({"seq": self.state.last_seq, "hash": self.state.hash()})

    async def healthz(self, request: web.Request) -> web.Response:
        ok = self.follower.running and self.follower.caught_up.is_set()
        degraded = self.follower.degraded()
        status = ("degraded" if degraded else "ok") if ok else "starting" if self.follower.running else "down"
        # Degraded is still 200: it serves (restarting would not help), but says it is out of date.
        body = {
            "status": status,
            "seq": self.state.last_seq,
            "following": self.follower.following,
            "degraded": degraded,
        }
        return json_response(body, status=200 if ok else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        text = render_metrics(self.state, self.submissions, following=self.follower.following)
        text += quarantine_metrics(self.state)
        index = self.follower.read_index
        text += read_index_metrics(index.reads, index.asked)
        text += refusal_metrics(self.fair_use.refusals)
        # the process's instruments: HTTP requests and latency (http_metrics), process and Python collectors
        text += generate_latest(REGISTRY).decode()
        return web.Response(text=text, content_type=PROMETHEUS_CONTENT_TYPE)

    async def openapi(self, request: web.Request) -> web.Response:
        document = openapi_document(self.priority_classes, self.default_priority, self.config.checkpoint_root)
        return json_response(document)


def submission_classes(queues: Queues | None) -> tuple[tuple[str, ...], str]:
    """The priority classes a submission may name, most important first, and the class of one that names
    none: the queue file's, as the scheduler and the simulator read them, else the built-in ones."""
    if queues is None:
        return PRIORITY_CLASSES, DEFAULT_PRIORITY
    values = queues.class_values()
    return tuple(sorted(values, key=lambda name: -values[name])), queues.default_priority


def check_not_an_org(queues: Queues, team: str) -> None:
    """Refuse an org's name as a job's team: the scheduler would run it as a team of that name with
    nominal 0, outside the org's limit. A name the file does not know stays a team (nominal 0)."""
    if queues.org(team) is None:
        return
    teams = sorted(t.name for t in queues.teams if team in queues.lineage(t.name))
    hint = f"submit for one of its teams: {', '.join(teams)}" if teams else "it has no teams"
    raise SpecError("team", f"{team!r} is an org in the queue file, not a team; {hint}")


def _team_from_token(payload: object, who: Principal) -> tuple[object, web.Response | None]:
    """The submission's team is the token's: filled in when absent, refused (403) when another.

    An admin names the team in the body (it may submit for any). Anything but a JSON object is left for
    the validator to refuse with its own message.
    """
    if who.admin or who.team is None or not isinstance(payload, dict):
        return payload, None
    team = payload.get("team")
    if team is None:
        return {**payload, "team": who.team}, None
    if team != who.team:
        return payload, forbidden(
            f"this token acts for team {who.team!r}; it cannot submit for {team!r}", field="team"
        )
    return payload, None


def _unwrap_cloudevent(envelope: object) -> tuple[object, str]:
    """Structured-mode CloudEvent -> (its data, its id). The required attributes must be present."""
    if not isinstance(envelope, dict):
        raise SpecError("body", "a CloudEvent must be a JSON object")
    _check_attributes({name: value for name, value in envelope.items() if name != "data"})
    if envelope.get("specversion") != "1.0":
        raise SpecError(
            "specversion", f"CloudEvents specversion must be '1.0', got {envelope.get('specversion')!r}"
        )
    for attribute in ("id", "source", "type"):
        value = envelope.get(attribute)
        if not isinstance(value, str) or not value:
            raise SpecError(attribute, f"CloudEvents attribute {attribute!r} is required (non-empty string)")
    # The id is the idempotency key unless a header names one: it must be a valid key either way.
    check_idempotency_key(envelope["id"], field="id")
    if "data_base64" in envelope:
        raise SpecError("data_base64", "binary data is not accepted; send the job spec as JSON in 'data'")
    if "data" not in envelope:
        raise SpecError("data", "the CloudEvent carries no data; put the job spec in 'data'")
    return envelope["data"], envelope["id"]


def _check_attributes(attributes: dict[str, Any]) -> None:
    """A CloudEvent's attributes, extensions included (the data is the spec: ``validate_spec``'s): each a
    JSON primitive, as the CloudEvents type system has no others, and every string clean."""
    check_strings(attributes)
    for name, value in attributes.items():
        if isinstance(value, list | dict):
            raise SpecError(name, "a CloudEvents attribute is a string, a number, a boolean or null")


FOLLOWER: web.AppKey[FoldFollower] = web.AppKey("follower", FoldFollower)
HANDLERS: web.AppKey[Handlers] = web.AppKey("handlers", Handlers)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def clean_input_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every query parameter and path parameter of every route holds clean text (``jobs.text``), or the
    answer is a 400 naming it. The raw query is decoded here because aiohttp turns a byte that is not
    UTF-8 into U+FFFD, which would pass: surrogateescape keeps it as a lone surrogate, which does not."""
    pairs = parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True, errors="surrogateescape")
    try:
        for name, value in [*pairs, *request.match_info.items()]:
            check_text(name, "query")
            check_text(value, name)
    except SpecError as err:
        return problem(400, "Invalid parameter", err.detail, slug="invalid-query", field=err.field)
    return await handler(request)


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error is problem+json, aiohttp's own (unknown route, wrong method, body too large) included."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == PROBLEM_JSON:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return problem(
            exc.status, exc.reason, exc.text or exc.reason, slug=f"http-{exc.status}", headers=headers
        )
    except asyncio.CancelledError:
        raise
    except Exception:
        _log.exception("unhandled error on %s %s", request.method, request.path)
        return problem(500, "Internal error", "unexpected error; see the API's log", slug="internal")


def build_app(
    log: EventLog,
    *,
    config: ApiConfig | None = None,
    follower: FoldFollower | None = None,
    auth: TokenStore | None = None,
) -> web.Application:
    """The application over ``log``; it starts following the log on startup and stops on cleanup.

    The caller owns ``log`` (connects and closes it), so tests can hand in the fixture's log. ``auth``:
    the tokens callers must present (``services/api/auth.py``); None serves everyone as an anonymous
    admin, for in-process tests only (`rally serve api` refuses to start without a token file).
    """
    config = config or ApiConfig()
    follower = follower or FoldFollower(log)
    # Reads ask where the log ends through the connection this API appends with, the one its writes'
    # acknowledgements came back on: a fold reading through a connection of its own may have lost it,
    # and then a read must say "not visible yet", not "the log is unavailable" while appends succeed.
    follower.read_index = ReadIndex(stream_tip(log, log.timeout))
    handlers = Handlers(log, follower, config)
    # problem_middleware outermost, so a 401 and whatever a handler raises are problem+json alike.
    app = web.Application(
        middlewares=[
            trace_middleware,  # outermost: the request's span covers the problem answers too
            metrics_middleware,  # requests by route and status, 401s included
            problem_middleware,
            *([auth_middleware(auth)] if auth is not None else []),
            clean_input_middleware,  # query and path parameters, for every route
        ]
    )
    app[FOLLOWER] = follower
    app[HANDLERS] = handlers

    async def start_following(app: web.Application) -> None:
        follower.start()

    async def stop_following(app: web.Application) -> None:
        await follower.stop()

    app.on_startup.append(start_following)
    app.on_cleanup.append(stop_following)
    app.router.add_post("/v1/jobs", handlers.submit)
    # the reads of the fold: linearizable, or stale when asked; each says which and at what log position
    reads = FoldReads(follower, config.ready_wait_s)
    app.router.add_get("/v1/jobs", reads(handlers.list_jobs))
    app.router.add_get("/v1/jobs/{job_id}", reads(handlers.get_job))
    app.router.add_delete("/v1/jobs/{job_id}", handlers.cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/checkpoints", reads(handlers.get_checkpoints))
    app.router.add_get("/v1/nodes", reads(handlers.list_nodes))
    # POST /v1/nodes/{id}/drain and /undrain: an operator's, admin tokens only
    add_node_routes(app, log, follower, config.source, config.fold_wait_s, config.drain)
    # PUT /v1/nodes/{id}/rules: an operator's labels and taints (admin tokens only)
    add_node_rules_route(app, log, follower, config.source, config.fold_wait_s)
    # POST /v1/jobs/{id}/suspend and /resume: the job's team or an admin
    add_suspend_routes(app, log, follower, config.source, config.fold_wait_s, handlers._ready)
    app.router.add_get("/v1/state", reads(handlers.get_state))
    app.router.add_get("/v1/openapi.json", handlers.openapi)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/metrics", handlers.metrics)
    add_dashboard_routes(app)  # GET /: the web dashboard over this same API
    # queues: the scheduler's queue file, when the API was given one (rally queues shows nominal quotas)
    add_history_routes(app, log, follower, getattr(config, "queues", None), config.drain)
    # rally why: reasons in numbers, and the predicted start
    add_why_routes(app, log, follower, getattr(config, "queues", None), handlers.predictions)
    add_predictions_route(app, handlers.predictions)  # rally predictions: how, and how good
    # rally run --pty / rally attach: an interactive job's terminal over a WebSocket
    add_terminal_routes(app, log, follower, config.queues, config.source)
    return app
