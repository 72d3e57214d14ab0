"""Fair use at submission, live over a real NATS JetStream (issue 30, item 7).

The queue file caps a team's waiting jobs (``max_pending_jobs``) and its submission rate
(``submissions_per_minute`` with ``submission_burst``): beyond either a team token gets 429 problem+json
naming the limit, with ``Retry-After``, and nothing is appended. A retry of an accepted submission is
answered as before; an admin is not limited. ``production`` is reserved for the teams the file grants it.
Every refusal is checked against the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.fairuse import PENDING_RETRY_AFTER_S
from test_api_auth import (  # this folder is on sys.path (rootdir-relative imports)
    Client,
    Tokens,
    assert_problem,
    events_of,
    register_nodes,
    spec,
    submit,
    submit_ok,
    tokens,  # noqa: F401 (a fixture, used by name)
)

from rallypoint.eventlog import EventLog
from rallypoint.events import JobSubmitted
from rallypoint.scheduling.queues import Org, Queues, Team
from rallypoint.security.tokens import TokenStore

#: nlp: at most 3 jobs waiting. vision (under the org ops, which grants production): a burst of 3, then one
#: a minute, so no token comes back while a test runs.
QUEUES = Queues(
    orgs=[Org(name="ops", priorities=["production", "training-standard"])],
    teams=[
        Team(name="nlp", nominal=8, max_pending_jobs=3),
        Team(name="vision", parent="ops", nominal=8, submissions_per_minute=1, submission_burst=3),
    ],
)
CLOUDEVENTS = "application/cloudevents+json"


@pytest.fixture
async def client(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)
    app = build_app(
        event_log, config=ApiConfig(source="test-api", queues=QUEUES), auth=TokenStore(tokens.path)
    )
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def submitted(log: EventLog) -> int:
    return len(await events_of(log, JobSubmitted))


async def assert_too_many(resp: Any, limit: str) -> dict[str, Any]:
    body = await assert_problem(resp, 429, None)
    assert body["limit"] == limit and limit in body["detail"]
    assert int(resp.headers["Retry-After"]) == body["retry_after_s"] >= 1
    return body


def vision(**overrides: Any) -> dict[str, Any]:
    return spec(**{"team": "vision", "priority": "training-standard", **overrides})


# --- submission rate --------------------------------------------------------------------------------------


async def test_a_burst_over_the_rate_is_429_with_retry_after_and_appends_nothing(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    answers = await asyncio.gather(*(submit(client, tokens.vision, vision(name=f"b{i}")) for i in range(12)))
    statuses = sorted(r.status for r in answers)
    assert statuses == [202] * 3 + [429] * 9
    for resp in answers:
        if resp.status == 429:
            body = await assert_too_many(resp, "submissions_per_minute")
            assert 1 <= body["retry_after_s"] <= 60  # one a minute
    assert await submitted(event_log) == 3


async def test_a_cloudevent_is_limited_too(client: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    for i in range(3):
        await submit_ok(client, tokens.vision, vision(name=f"b{i}"))
    envelope = {"specversion": "1.0", "id": "ci-42", "source": "ci", "type": "job", "data": vision()}
    headers = Tokens.auth(tokens.vision) | {"Content-Type": CLOUDEVENTS}
    resp = await client.post("/v1/jobs", data=client.session.json_serialize(envelope), headers=headers)
    await assert_too_many(resp, "submissions_per_minute")
    assert await submitted(event_log) == 3


async def test_a_retry_of_an_accepted_key_is_answered_as_before_never_429(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    first = await submit(client, tokens.vision, vision(name="keyed"), key="build-7")
    assert first.status == 202
    job_id = (await first.json())["job_id"]
    for i in range(2):
        await submit_ok(client, tokens.vision, vision(name=f"b{i}"))
    await assert_too_many(await submit(client, tokens.vision, vision(name="new")), "submissions_per_minute")

    again = await submit(client, tokens.vision, vision(name="keyed"), key="build-7")
    assert again.status == 202, await again.text()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["job_id"] == job_id
    assert await submitted(event_log) == 3


async def test_a_retry_through_another_replica_is_not_refused_either(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    """This replica's bucket is empty when a retry of what another replica accepted arrives here: it is
    answered as the other did (202 replayed), found in the fold, or in the log when the fold lags."""
    another = build_app(
        event_log, config=ApiConfig(source="test-api-a", queues=QUEUES), auth=TokenStore(tokens.path)
    )
    async with test_utils.TestClient(test_utils.TestServer(another)) as other:
        for i in range(3):
            await submit_ok(client, tokens.vision, vision(name=f"b{i}"))
        job_id = await submit_ok(other, tokens.vision, vision(name="keyed"), key="build-8")
        again = await submit(client, tokens.vision, vision(name="keyed"), key="build-8")
        assert again.status == 202, await again.text()
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (await again.json())["job_id"] == job_id
    assert await submitted(event_log) == 4


# --- jobs waiting -----------------------------------------------------------------------------------------


async def test_over_max_pending_jobs_is_429_until_one_leaves_the_queue(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    # concurrent: the fold has applied none of them when the others are checked
    answers = await asyncio.gather(*(submit(client, tokens.nlp, spec(name=f"p{i}")) for i in range(8)))
    accepted = [await r.json() for r in answers if r.status == 202]
    assert len(accepted) == 3
    for resp in answers:
        if resp.status != 202:
            body = await assert_too_many(resp, "max_pending_jobs")
            assert body["retry_after_s"] == PENDING_RETRY_AFTER_S
    assert await submitted(event_log) == 3

    # the admin is not limited (an operator's override); its job counts against the team's queue
    await submit_ok(client, tokens.admin, spec(name="ops-job"))
    # a cancelled job leaves the queue: one slot again, while the admin's job still takes one
    cancel = await client.delete(f"/v1/jobs/{accepted[0]['job_id']}", headers=Tokens.auth(tokens.nlp))
    assert cancel.status == 202
    await assert_too_many(await submit(client, tokens.nlp, spec(name="still-full")), "max_pending_jobs")
    cancel = await client.delete(f"/v1/jobs/{accepted[1]['job_id']}", headers=Tokens.auth(tokens.nlp))
    assert cancel.status == 202
    await submit_ok(client, tokens.nlp, spec(name="room-again"))
    assert await submitted(event_log) == 5


# --- priority classes -------------------------------------------------------------------------------------


async def test_production_is_refused_without_a_grant_and_accepted_with_one(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    before = await submitted(event_log)
    body = await assert_problem(
        await submit(client, tokens.nlp, spec(priority="production")), 403, "priority"
    )
    assert "'production' (reserved; the queue file must grant it)" in body["detail"]
    assert await submitted(event_log) == before
    # nlp may use every other class; vision's org grants production and training-standard only
    await submit_ok(client, tokens.nlp, spec(priority="training-high"))
    await submit_ok(client, tokens.vision, vision(priority="production"))
    body = await assert_problem(
        await submit(client, tokens.vision, vision(priority="development")), 403, "priority"
    )
    assert "its classes: production, training-standard" in body["detail"]
    # an admin may (an operator's override)
    await submit_ok(client, tokens.admin, spec(priority="production", name="ops-prod"))


# --- metrics ----------------------------------------------------------------------------------------------


async def test_refusals_are_counted_by_team_and_limit(client: Client, tokens: Tokens) -> None:  # noqa: F811
    for i in range(5):
        await submit(client, tokens.vision, vision(name=f"b{i}"))
    await submit(client, tokens.nlp, spec(priority="production"))
    text = await (await client.get("/metrics")).text()
    assert 'rally_api_fair_use_refusals_total{team="vision",limit="submissions_per_minute"} 2' in text
    assert 'rally_api_fair_use_refusals_total{team="nlp",limit="priority"} 1' in text
    assert 'rally_api_submissions_total{outcome="limited"} 2' in text
