"""``POST /v1/jobs`` with ``array``: one job per index, appended all or nothing (``jobs.arrays``).

The array's id is what the job's id would be (from the Idempotency-Key, else random); its members are
``<array id>_<index>``. The first member's subject must be empty (expected subject sequence 0), so a retry
of the same array after the log's duplicate window is recognised, not appended twice; within it, the
message ids make the whole batch a duplicate. The answer is 202 with ``array_id`` and every ``job_ids``.
"""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from rallypoint.eventlog import AppendConflict, EventLog, LogUnavailable
from rallypoint.eventlog.log import Append, BatchResult
from rallypoint.events import JobSpec, JobSubmitted, subjects
from rallypoint.jobs.arrays import ArrayRequest, member_id, members
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState

from .problems import problem, unavailable

__all__ = ["accepted_array", "append_array", "existing_array"]


def accepted_array(array_id: str, job_ids: list[str], seq: int, *, replayed: bool) -> web.Response:
    """The 202 of an array: its id, its members' ids in index order, the first member's sequence."""
    headers = {"Location": f"/v1/jobs?array={array_id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    body = {
        "job_id": job_ids[0],
        "array_id": array_id,
        "job_ids": job_ids,
        "seq": seq,
        "state": "pending",
        "links": {"self": f"/v1/jobs?array={array_id}"},
    }
    return web.Response(
        status=202, body=msgspec.json.encode(body), content_type="application/json", headers=headers
    )


def existing_array(
    state: ClusterState, array_id: str, request: ArrayRequest, spec: JobSpec
) -> web.Response | None:
    """The answer to a retry of an array the fold holds (its first member): the same 202, or 422 when the
    key was used for another spec; None when the array is not there."""
    first = state.jobs.get(member_id(array_id, request.indices[0]))
    if first is None:
        return None
    expected = dict(members(array_id, spec, request))
    if first.spec != expected[first.job_id]:
        return problem(
            422,
            "Idempotency key reused",
            f"the Idempotency-Key was already used for array {array_id} with a different spec; use a new key",
            slug="idempotency-key-reused",
            field="idempotency_key",
        )
    return accepted_array(array_id, list(expected), first.submitted_seq, replayed=True)


async def append_array(
    log: EventLog,
    array_id: str,
    spec: JobSpec,
    request: ArrayRequest,
    who: Principal,
    key: str | None,
    source: str,
) -> web.Response | BatchResult:
    """Append every member at once: where they landed, or the 409/503 to answer."""
    now = time.time()
    entries = [
        Append(
            subject=subjects.job(job_id),
            event=JobSubmitted(
                job_id=job_id, spec=member, submitted_at=now, idempotency_key=key, submitted_by=who.user
            ),
            msg_id=f"{job_id}:0:JobSubmitted",
        )
        for job_id, member in members(array_id, spec, request)
    ]
    try:
        result = await log.append_batch(
            entries,
            source=source,
            expected_last_subject_seq=0,
            expected_subject_filter=entries[0].subject,
        )
    except AppendConflict:
        return problem(
            409, "Array already submitted", f"array {array_id} exists; retry reads it", slug="array-exists"
        )
    except LogUnavailable as exc:
        return unavailable(
            f"the event log did not acknowledge the array ({exc}); retry with the same Idempotency-Key"
        )
    return result
