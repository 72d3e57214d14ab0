"""Authentication and team scoping of the HTTP API, live over a real NATS JetStream.

Issue 18, item 1: no token -> 401; a team token cannot read or cancel another team's job (404, as a
missing one: issue 30) or submit for another team (403);
an admin can; the same idempotency key in two teams makes two jobs; a team cannot submit above the
priority classes its queue allows. Every refusal is also checked against the stream: nothing appended.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.openapi import openapi_document

from rallypoint.eventlog import EventLog
from rallypoint.events import GpuInfo, JobCancelRequested, JobSubmitted, NodeRegistered, subjects
from rallypoint.jobs import job_id_for
from rallypoint.scheduling.queues import Queues, Team
from rallypoint.security.tokens import TokenStore, create_token, revoke_token

E = TypeVar("E")
Client = test_utils.TestClient[web.Request, web.Application]
PROBLEM = "application/problem+json"


def spec(**overrides: Any) -> dict[str, Any]:
    return {"name": "pretrain", "team": "nlp", "gpus": 8, "command": ["python", "train.py"], **overrides}


async def register_nodes(log: EventLog) -> None:
    """Two 8-GPU nodes: enough for every spec here."""
    for i in range(2):
        gpus = tuple(
            GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(8)
        )
        event = NodeRegistered(
            node_id=f"n{i}", address=f"10.0.0.{i}", rack="r0", gpu_type="H100", gpus=gpus,
            cpu_milli=96000, memory_mib=1 << 20, agent_instance="test", at=1.0,
        )  # fmt: skip
        await log.append(
            subjects.node_registration(f"n{i}"), event, msg_id=f"n{i}:0:NodeRegistered", source="test"
        )


async def events_of(log: EventLog, kind: type[E]) -> list[E]:
    return [r.event async for r in log.replay() if isinstance(r.event, kind)]


async def assert_problem(resp: Any, status: int, field: str | None) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == PROBLEM
    body: dict[str, Any] = await resp.json()
    assert body["status"] == status and body["detail"]
    assert body.get("field") == field
    return body


@dataclass(frozen=True)
class Tokens:
    path: Path
    admin: str
    nlp: str
    vision: str
    nlp_id: str

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


QUEUES = Queues(
    teams=[Team(name="nlp", nominal=16, max_priority="training-standard"), Team(name="vision", nominal=16)]
)


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    path = tmp_path / "tokens.json"
    _, admin = create_token(path, user="root-ops", admin=True)
    nlp_record, nlp = create_token(path, user="alice", team="nlp")
    _, vision = create_token(path, user="bob", team="vision")
    return Tokens(path=path, admin=admin, nlp=nlp, vision=vision, nlp_id=nlp_record.id)


@pytest.fixture
async def client(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:
    await register_nodes(event_log)
    app = build_app(
        event_log, config=ApiConfig(source="test-api", queues=QUEUES), auth=TokenStore(tokens.path)
    )
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def submit(client: Client, token: str, body: dict[str, Any], key: str | None = None) -> Any:
    headers = Tokens.auth(token) | ({"Idempotency-Key": key} if key else {})
    return await client.post("/v1/jobs", json=body, headers=headers)


async def submit_ok(client: Client, token: str, body: dict[str, Any], key: str | None = None) -> str:
    resp = await submit(client, token, body, key)
    assert resp.status == 202, await resp.text()
    return str((await resp.json())["job_id"])


# --- 401 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/j-000000000000"), ("GET", "/v1/nodes"),
     ("DELETE", "/v1/jobs/j-000000000000"), ("GET", "/v1/state"), ("GET", "/v2/unknown")],
)  # fmt: skip
async def test_no_token_is_401_everywhere(
    client: Client, event_log: EventLog, method: str, path: str
) -> None:
    before = await event_log.last_seq()
    resp = await client.request(method, path, json=spec())
    await assert_problem(resp, 401, None)
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="rallypoint"'
    assert await event_log.last_seq() == before


@pytest.mark.parametrize(
    "header", ["Bearer rly_not-a-token", "Basic YWxpY2U6cHc=", "Bearer", "Bearer    ", "rly_bare-token"]
)
async def test_bad_token_is_401_invalid_token(client: Client, header: str) -> None:
    resp = await client.get("/v1/jobs", headers={"Authorization": header})
    body = await assert_problem(resp, 401, None)
    assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]
    assert "token" in body["detail"].lower()


async def test_public_paths_need_no_token(client: Client) -> None:
    for path in ("/healthz", "/metrics", "/v1/openapi.json"):
        resp = await client.get(path)
        # /healthz may still say 503 "starting": what matters is that it answers without a token.
        assert resp.status in (200, 503) and resp.content_type != PROBLEM, (path, await resp.text())


async def test_revocation_takes_effect_without_restart(client: Client, tokens: Tokens) -> None:
    assert (await client.get("/v1/jobs", headers=Tokens.auth(tokens.nlp))).status == 200
    revoke_token(tokens.path, tokens.nlp_id)
    await assert_problem(await client.get("/v1/jobs", headers=Tokens.auth(tokens.nlp)), 401, None)
    # The other tokens in the same file still work.
    assert (await client.get("/v1/jobs", headers=Tokens.auth(tokens.vision))).status == 200
    # A token created after the API started works at once, too.
    _, late = create_token(tokens.path, user="carol", team="nlp")
    assert (await client.get("/v1/jobs", headers=Tokens.auth(late))).status == 200


# --- the team comes from the token -----------------------------------------------------------------------


async def test_team_and_user_come_from_the_token(client: Client, event_log: EventLog, tokens: Tokens) -> None:
    body = spec()
    del body["team"]
    job_id = await submit_ok(client, tokens.nlp, body)
    resp = await client.get(f"/v1/jobs/{job_id}", headers=Tokens.auth(tokens.nlp))
    assert (await resp.json())["team"] == "nlp"
    [event] = await events_of(event_log, JobSubmitted)
    assert event.spec.team == "nlp" and event.submitted_by == "alice"


async def test_team_token_cannot_submit_for_another_team(
    client: Client, event_log: EventLog, tokens: Tokens
) -> None:
    before = await event_log.last_seq()
    await assert_problem(await submit(client, tokens.nlp, spec(team="vision")), 403, "team")
    ce = {"specversion": "1.0", "id": "ce-1", "source": "ci", "type": "job", "data": spec(team="vision")}
    resp = await client.post(
        "/v1/jobs",
        data=json.dumps(ce),
        headers=Tokens.auth(tokens.nlp) | {"Content-Type": "application/cloudevents+json"},
    )
    await assert_problem(resp, 403, "team")
    assert await event_log.last_seq() == before


async def test_admin_submits_for_any_team_but_must_name_it(
    client: Client, event_log: EventLog, tokens: Tokens
) -> None:
    job_id = await submit_ok(client, tokens.admin, spec(team="vision"))
    [event] = await events_of(event_log, JobSubmitted)
    assert event.job_id == job_id and event.spec.team == "vision" and event.submitted_by == "root-ops"
    body = spec()
    del body["team"]
    await assert_problem(await submit(client, tokens.admin, body), 422, "team")


# --- reading and cancelling another team's job ----------------------------------------------------------


async def test_team_cannot_read_or_cancel_another_teams_job(
    client: Client, event_log: EventLog, tokens: Tokens
) -> None:
    job_id = await submit_ok(client, tokens.nlp, spec())
    vision = Tokens.auth(tokens.vision)
    # 404, as for a missing job: another team's job is not even confirmed to exist (issue 30)
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/checkpoints"):
        body = await assert_problem(await client.get(path, headers=vision), 404, None)
        assert "nlp" not in body["detail"]  # the owner is not named
    before = await event_log.last_seq()
    await assert_problem(await client.delete(f"/v1/jobs/{job_id}", headers=vision), 404, None)
    assert await event_log.last_seq() == before
    # An unknown job is still a 404, for every token.
    await assert_problem(await client.get("/v1/jobs/j-000000000000", headers=vision), 404, None)


async def test_team_lists_only_its_jobs(client: Client, tokens: Tokens) -> None:
    nlp_job = await submit_ok(client, tokens.nlp, spec())
    vision_job = await submit_ok(client, tokens.vision, spec(team="vision"))
    listed = await (await client.get("/v1/jobs", headers=Tokens.auth(tokens.nlp))).json()
    assert [j["job_id"] for j in listed["jobs"]] == [nlp_job]
    own = await client.get("/v1/jobs?team=nlp", headers=Tokens.auth(tokens.nlp))
    assert [j["job_id"] for j in (await own.json())["jobs"]] == [nlp_job]
    await assert_problem(
        await client.get("/v1/jobs?team=vision", headers=Tokens.auth(tokens.nlp)), 403, "team"
    )
    everything = await (await client.get("/v1/jobs", headers=Tokens.auth(tokens.admin))).json()
    assert {j["job_id"] for j in everything["jobs"]} == {nlp_job, vision_job}


async def test_admin_reads_and_cancels_any_job(client: Client, event_log: EventLog, tokens: Tokens) -> None:
    job_id = await submit_ok(client, tokens.nlp, spec())
    admin = Tokens.auth(tokens.admin)
    assert (await client.get(f"/v1/jobs/{job_id}", headers=admin)).status == 200
    assert (await client.get(f"/v1/jobs/{job_id}/checkpoints", headers=admin)).status == 200
    resp = await client.delete(f"/v1/jobs/{job_id}", headers=admin | {"X-Rally-User": "mallory"})
    assert resp.status == 202, await resp.text()
    [cancel] = await events_of(event_log, JobCancelRequested)
    assert cancel.requested_by == "root-ops"  # from the token; the header is not trusted


async def test_owner_cancels_its_own_job(client: Client, event_log: EventLog, tokens: Tokens) -> None:
    job_id = await submit_ok(client, tokens.nlp, spec())
    resp = await client.delete(f"/v1/jobs/{job_id}", headers=Tokens.auth(tokens.nlp))
    assert resp.status == 202, await resp.text()
    [cancel] = await events_of(event_log, JobCancelRequested)
    assert cancel.requested_by == "alice"


# --- idempotency keys are per team ----------------------------------------------------------------------


async def test_same_key_in_two_teams_makes_two_jobs(
    client: Client, event_log: EventLog, tokens: Tokens
) -> None:
    nlp_job = await submit_ok(client, tokens.nlp, spec(), key="build-42")
    vision_job = await submit_ok(client, tokens.vision, spec(team="vision"), key="build-42")
    assert nlp_job != vision_job
    assert (nlp_job, vision_job) == (job_id_for("nlp", "build-42"), job_id_for("vision", "build-42"))
    # A retry in each team lands on that team's job, not the other's.
    again = await submit(client, tokens.vision, spec(team="vision"), key="build-42")
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["job_id"] == vision_job
    events = await events_of(event_log, JobSubmitted)
    assert sorted(e.spec.team for e in events) == ["nlp", "vision"]
    assert all(isinstance(e, JobSubmitted) for e in events)


# --- priority classes from the queue file ---------------------------------------------------------------


async def test_team_cannot_submit_above_its_max_priority(
    client: Client, event_log: EventLog, tokens: Tokens
) -> None:
    before = await event_log.last_seq()
    for above in ("training-high", "production"):
        body = await assert_problem(await submit(client, tokens.nlp, spec(priority=above)), 403, "priority")
        assert "training-standard" in body["detail"]
    assert await event_log.last_seq() == before
    for allowed in ("training-standard", "development", "best-effort"):
        await submit_ok(client, tokens.nlp, spec(priority=allowed, name=f"job-{allowed}"))


async def test_team_without_a_ceiling_may_use_every_class_but_production_and_admin_any(
    client: Client, tokens: Tokens
) -> None:
    await submit_ok(client, tokens.vision, spec(team="vision", priority="training-high"))
    # production is reserved for teams the queue file grants it (tests/integration/test_api_fair_use.py)
    refused = await submit(client, tokens.vision, spec(team="vision", priority="production"))
    await assert_problem(refused, 403, "priority")
    await submit_ok(client, tokens.admin, spec(team="nlp", priority="production"))


async def test_no_queue_file_allows_every_class(event_log: EventLog, tokens: Tokens) -> None:
    await register_nodes(event_log)
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tokens.path))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        await submit_ok(c, tokens.nlp, spec(priority="production"))


# --- the document says so -------------------------------------------------------------------------------


def test_openapi_documents_bearer_auth() -> None:
    doc = openapi_document()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert doc["security"] == [{"bearer": []}]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":
                continue
            if path in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json", "/", "/dashboard/{name}"):
                assert operation["security"] == [], path
            else:
                assert {"401", "403"} <= set(operation["responses"]), (method, path)
