"""The API honours the queue file at submission, live over a real NATS JetStream.

A queue file may define its own priority classes and default class: the API accepts those (not the
built-in ones), gives a job without ``priority`` the file's default as the scheduler and the simulator
do, and serves them in its OpenAPI document. An org's name is not a team: a job under it would run as a
team of nominal 0 outside the org's limit, so it is refused (422 naming ``team``, with the org's teams).
``rally submit`` leaves the classes to the API. Every refusal is checked against the stream too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app
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

from rallypoint.cli.jobs_cmds import EXIT_ERROR, EXIT_OK
from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog
from rallypoint.events import JobSubmitted
from rallypoint.scheduling.queues import Org, PriorityClass, Queues, Team
from rallypoint.security.tokens import TokenStore

QUEUES = Queues(
    priority_classes=[
        PriorityClass(name="batch", value=300),
        PriorityClass(name="urgent", value=900),
        PriorityClass(name="scavenger", value=0),
    ],
    default_priority="batch",
    orgs=[Org(name="research", limit=16), Org(name="language", parent="research"), Org(name="empty")],
    teams=[
        Team(name="nlp", parent="language", nominal=8, max_priority="batch"),
        Team(name="vision", parent="research", nominal=8),
        Team(name="infra", nominal=4),
    ],
)
#: How the API names the file's classes: most important first.
CLASSES = "urgent, batch, scavenger"


@pytest.fixture
async def client(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)
    app = build_app(
        event_log, config=ApiConfig(source="test-api", queues=QUEUES), auth=TokenStore(tokens.path)
    )
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def priority_of(log: EventLog, job_id: str) -> str:
    (job,) = [e for e in await events_of(log, JobSubmitted) if e.job_id == job_id]
    return job.spec.priority


# --- priority classes and the default -----------------------------------------------------------------


async def test_no_priority_gets_the_queue_files_default(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    job_id = await submit_ok(client, tokens.admin, spec(team="vision"))
    assert await priority_of(event_log, job_id) == "batch"
    resp = await client.get(f"/v1/jobs/{job_id}", headers=Tokens.auth(tokens.admin))
    assert (await resp.json())["priority"] == "batch"


async def test_a_class_of_the_queue_file_is_accepted(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    job_id = await submit_ok(client, tokens.vision, spec(team="vision", priority="scavenger"))
    assert await priority_of(event_log, job_id) == "scavenger"


@pytest.mark.parametrize("priority", ["training-standard", "production", "Batch"])
async def test_a_class_the_queue_file_lacks_is_422_listing_its_classes(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    priority: str,
) -> None:
    before = await event_log.last_seq()
    resp = await submit(client, tokens.admin, spec(team="vision", priority=priority))
    body = await assert_problem(resp, 422, "priority")
    assert body["detail"] == f"{priority!r} is not a priority class here; one of {CLASSES}"
    assert await event_log.last_seq() == before


async def test_max_priority_ranks_the_queue_files_classes(client: Client, tokens: Tokens) -> None:  # noqa: F811
    # nlp's ceiling is batch: urgent is above it, scavenger below
    body = await assert_problem(await submit(client, tokens.nlp, spec(priority="urgent")), 403, "priority")
    assert "'batch' or below (batch, scavenger)" in body["detail"]
    await submit_ok(client, tokens.nlp, spec(priority="scavenger"))


async def test_the_openapi_document_lists_the_queue_files_classes(client: Client) -> None:
    doc = await (await client.get("/v1/openapi.json")).json()
    priority = doc["components"]["schemas"]["JobSpec"]["properties"]["priority"]
    assert priority["enum"] == ["urgent", "batch", "scavenger", None]
    assert priority["default"] == "batch"


# --- an org is not a team -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("org", "teams"),
    [("research", "submit for one of its teams: nlp, vision"),
     ("language", "submit for one of its teams: nlp"),
     ("empty", "it has no teams")],
)  # fmt: skip
async def test_an_orgs_name_as_team_is_422_listing_its_teams(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    org: str,
    teams: str,
) -> None:
    before = await event_log.last_seq()
    body = await assert_problem(await submit(client, tokens.admin, spec(team=org)), 422, "team")
    assert body["detail"] == f"{org!r} is an org in the queue file, not a team; {teams}"
    assert await event_log.last_seq() == before


async def test_a_team_the_queue_file_does_not_list_is_still_accepted(client: Client, tokens: Tokens) -> None:  # noqa: F811
    await submit_ok(client, tokens.admin, spec(team="newcomers"))
    await submit_ok(client, tokens.admin, spec(team="infra"))


# --- rally submit leaves the classes to the API ---------------------------------------------------------


async def rally_submit(client: Client, token: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``rally submit`` against the live API: the CLI blocks, so it runs in a thread while the loop serves."""
    monkeypatch.setenv("RALLY_TOKEN", token)
    monkeypatch.delenv("RALLY_TEAM", raising=False)
    url = str(client.make_url("")).rstrip("/")
    argv = ["submit", "--api-url", url, "--gpus", "8", *argv, "--", "python", "train.py"]
    code: int = await asyncio.to_thread(rally, argv)
    return code


async def test_rally_submit_leaves_the_class_to_the_api(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--team", "vision", "--priority", "scavenger"]
    assert await rally_submit(client, tokens.admin, argv, monkeypatch) == EXIT_OK
    job_id = capsys.readouterr().out.strip()
    assert await priority_of(event_log, job_id) == "scavenger"

    # refusals: the API's line, exit 2, nothing appended
    before = await event_log.last_seq()
    argv = ["--team", "vision", "--priority", "production"]
    assert await rally_submit(client, tokens.admin, argv, monkeypatch) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err == f"error: --priority: 'production' is not a priority class here; one of {CLASSES}"
    assert await rally_submit(client, tokens.admin, ["--team", "research"], monkeypatch) == EXIT_ERROR
    assert capsys.readouterr().err.startswith("error: --team: 'research' is an org in the queue file")
    assert await event_log.last_seq() == before
