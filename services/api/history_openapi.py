"""The OpenAPI description of the accounting routes (``history_views``), merged into the document.

The response schemas are generated from the structs the handlers encode (``msgspec``), so the document
and the JSON cannot drift; the paths are written by hand like the rest of ``openapi.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from rallypoint.accounting import QueuesReport, UsageReport
from rallypoint.jobs.history import JobHistory
from rallypoint.state import TERMINAL

from .history_views import FinishedJobs, LogChunk
from .reads import document_fold_read
from .usage_history import MAX_BUCKETS, UsageHistory

_REF = "#/components/schemas/{name}"
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
# What ``time_param`` reads: empty (no bound), epoch seconds, or an ISO 8601 date and time. The pattern is
# stricter than the parser (days up to 28, so every match is a real date): a client never sends a value
# the document allows and the server refuses.
_EPOCH = r"-?[0-9]{1,12}(\.[0-9]{1,9})?"
_DATE = r"[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
_CLOCK = r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?"
_ZONE = r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_TIME = {
    "type": "string",
    "pattern": f"^({_EPOCH}|{_DATE}(T{_CLOCK}{_ZONE}?)?)?$",
    "description": "Seconds since the epoch, or an ISO 8601 time (UTC unless it names a zone).",
}


def comma_list(values: Iterable[str]) -> dict[str, Any]:
    """A query parameter holding a comma-separated list of these words (empty: no filter)."""
    word = "(" + "|".join(sorted(values)) + ")"
    return {"type": "string", "pattern": f"^({word}(,{word})*)?$"}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _ok(description: str, name: str) -> dict[str, Any]:
    schema = {"$ref": _REF.format(name=name)}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    schema = {"$ref": _REF.format(name="Problem")}
    return {"description": description, "content": {"application/problem+json": {"schema": schema}}}


def history_schemas() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [JobHistory, FinishedJobs, UsageReport, UsageHistory, QueuesReport, LogChunk], ref_template=_REF
    )
    return components


def history_paths() -> dict[str, Any]:
    window = [_query("since", _TIME, "From this time."), _query("until", _TIME, "Until this time.")]
    team = _query("team", {"type": "string"}, "Only this team (a team token sees only its own).")
    bad = _problem("An invalid query parameter.")
    # the log itself is read: no stale view of it (``reads.refuses_stale``)
    bad_or_stale = _problem("An invalid query parameter, or `stale=true` (not offered: these read the log).")
    return {
        "/v1/jobs/{job_id}/history": {
            "parameters": [_JOB_ID],
            "get": document_fold_read(
                {
                    "operationId": "getJobHistory",
                    "summary": "A job's whole story from the log: every attempt, reasons, preemptions, "
                    "recovery",
                    "responses": {
                        "200": _ok("The job's history.", "JobHistory"),
                        "404": _problem("Unknown job."),
                    },
                },
                _problem,
                stale=False,
            ),
        },
        "/v1/jobs/{job_id}/logs": {
            "parameters": [_JOB_ID],
            "get": document_fold_read(
                {
                    "operationId": "getJobLogs",
                    "summary": "A chunk of one rank's output, read by its node's agent",
                    "parameters": [
                        _query(
                            "rank",
                            {"type": "integer", "minimum": 0},
                            "Which rank (default: the rank whose exit failed the attempt, else 0; the "
                            "answer's `rank` says which).",
                        ),
                        _query(
                            "attempt", {"type": "integer", "minimum": 1}, "Which attempt (default current)."
                        ),
                        _query("offset", {"type": "integer", "minimum": 0}, "Byte offset to read from."),
                        _query("limit", {"type": "integer", "minimum": 1}, "Most bytes to return."),
                    ],
                    "responses": {
                        "200": _ok("A chunk; ask again from next_offset.", "LogChunk"),
                        "400": bad,
                        "404": _problem("Unknown job or attempt."),
                        "409": _problem("Nothing placed yet."),
                        "502": _problem("The agent refused."),
                        "503": _problem("The agent did not answer."),
                    },
                },
                _problem,
                stale=False,
            ),
        },
        "/v1/history": {
            "get": {
                "operationId": "listFinishedJobs",
                "summary": "Finished jobs with accounting columns (sacct)",
                "parameters": [
                    team,
                    *window,
                    _query("state", comma_list(TERMINAL), "Comma list of end states."),
                    _query("limit", {"type": "integer", "minimum": 1}, "The newest N."),
                ],
                "responses": {"200": _ok("Jobs, oldest end first.", "FinishedJobs"), "400": bad_or_stale},
            }
        },
        "/v1/usage": {
            "get": {
                "operationId": "getUsage",
                "summary": "GPU-hours over every attempt by team, user or priority class",
                "parameters": [
                    _query("by", {"type": "string", "enum": ["team", "user", "class"]}, "Group by."),
                    team,
                    *window,
                    _query("price_per_gpu_hour", {"type": "number"}, "Showback price."),
                    _query("now", _TIME, "Charge running attempts up to this time (default: now)."),
                ],
                "responses": {"200": _ok("Usage per group.", "UsageReport"), "400": bad_or_stale},
            }
        },
        "/v1/usage/history": {
            "get": {
                "operationId": "getUsageHistory",
                "summary": "GPUs in use per team over time, in buckets (the dashboard's usage chart)",
                "parameters": [
                    team,
                    _query("since", _TIME, "From this time (default: the first GPU use of the last 6 h)."),
                    _query("until", _TIME, "Until this time (default: now)."),
                    _query(
                        "step",
                        {"type": "integer", "minimum": 1},
                        f"Bucket length in seconds (default: a round step giving at most 360 buckets); "
                        f"widened where it would give more than {MAX_BUCKETS} (the answer's step_s).",
                    ),
                ],
                "responses": {"200": _ok("Buckets per team.", "UsageHistory"), "400": bad_or_stale},
            }
        },
        "/v1/queues": {
            "get": document_fold_read(
                {
                    "operationId": "getQueues",
                    "summary": "Nominal, borrowed, used and pending GPUs per team and cohort",
                    "responses": {"200": _ok("Queues.", "QueuesReport")},
                },
                _problem,
            )
        },
    }
