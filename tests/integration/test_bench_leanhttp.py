"""The scale bench's lean HTTP load generator against the real API over a real JetStream log.

It must count what the issue counts: a submission is accepted only when the API answered 202 (the
append acknowledged), each with its own Idempotency-Key, over HTTP with the bearer token; refusals
count as failed, never as accepted.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app

from rallypoint.bench.leanhttp import submit_lean
from rallypoint.bench.loadgen import spec_body
from rallypoint.eventlog import EventLog
from rallypoint.events import JobSubmitted
from rallypoint.jobs import job_id_for
from rallypoint.security.tokens import TokenStore, create_token


async def _serve(event_log: EventLog, tokens: Path) -> test_utils.TestServer:
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tokens))
    server = test_utils.TestServer(app)
    await server.start_server()
    return server


async def _submitted(log: EventLog) -> list[JobSubmitted]:
    return [r.event async for r in log.replay() if isinstance(r.event, JobSubmitted)]


async def test_every_202_is_one_appended_job_with_its_key(event_log: EventLog, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    _, token = create_token(tokens, user="bench", team="bench")
    server = await _serve(event_log, tokens)
    try:
        url = str(server.make_url("")).rstrip("/")
        body = spec_body("lean", 1, 10)
        accepted, took, failed = await submit_lean(
            url, 40, concurrency=16, body=body, prefix="lean", time_limit_s=30, token=token
        )
        # The same keys again: idempotent replays, answered 202 with the same ids, nothing appended.
        again, _, failed_again = await submit_lean(
            url, 40, concurrency=16, body=body, prefix="lean", time_limit_s=30, token=token
        )
    finally:
        await server.close()
    assert failed == 0 and failed_again == 0 and took > 0
    expected = {job_id_for("bench", f"lean-{i}") for i in range(40)}
    assert {s.job_id for s in accepted} == expected
    assert {s.job_id for s in again} == expected
    stored = await _submitted(event_log)
    assert sorted(e.job_id for e in stored) == sorted(expected)
    assert {e.idempotency_key for e in stored} == {f"lean-{i}" for i in range(40)}
    assert all(e.submitted_by == "bench" for e in stored)


async def test_refusals_count_as_failed_not_accepted(event_log: EventLog, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    _, token = create_token(tokens, user="bench", team="bench")
    server = await _serve(event_log, tokens)
    try:
        url = str(server.make_url("")).rstrip("/")
        wrong_token, _, unauthorized = await submit_lean(
            url, 5, concurrency=2, body=spec_body("x", 1, 1), prefix="a", time_limit_s=30, token="nope"
        )
        invalid, _, refused = await submit_lean(
            url, 5, concurrency=2, body={"team": "bench"}, prefix="b", time_limit_s=30, token=token
        )
    finally:
        await server.close()
    assert (wrong_token, unauthorized) == ([], 5)
    assert (invalid, refused) == ([], 5)
    assert await _submitted(event_log) == []
