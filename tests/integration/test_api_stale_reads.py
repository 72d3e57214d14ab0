"""Stale reads (``?stale=true``): what operators still see while NATS is unreachable (docs/api.md,
"Reading what was written").

A real nats-server is stopped under a running API: its default reads refuse with 503 log-unavailable
(it cannot know what it has missed), while a stale read answers from its fold at once and says so in
its headers. `rally jobs` / `rally nodes` with and without --stale run against the same live API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import build_app
from rallypoint_services.api.openapi import openapi_document
from rallypoint_services.api.reads import READ_HEADER, SEQ_HEADER
from test_api_auth import register_nodes, spec  # this folder is on sys.path (rootdir-relative imports)

from rallypoint.cli.client import ApiError
from rallypoint.cli.jobs_cmds import EXIT_ERROR, EXIT_OK
from rallypoint.cli.main import main as rally
from rallypoint.cli.stale import error_line
from rallypoint.eventlog import EventLog
from rallypoint.infra import NatsServer

Client = test_utils.TestClient[web.Request, web.Application]

#: The reads of the fold, each answering 200 for the submitted job's cluster (``{job}``: its id).
FOLD_READS = (
    "/v1/jobs/{job}",
    "/v1/jobs",
    "/v1/jobs/{job}/checkpoints",
    "/v1/nodes",
    "/v1/state",
    "/v1/queues",
)


@dataclass
class Outage:
    client: Client
    server: NatsServer
    job_id: str
    seq: int  # where the log ended when NATS went away


@pytest.fixture
async def outage(tmp_path: Path) -> AsyncIterator[Outage]:
    """An API that folded two nodes and a job, then lost its NATS server."""
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="stale-test")
    try:
        await register_nodes(log)
        async with test_utils.TestClient(test_utils.TestServer(build_app(log))) as client:
            resp = await client.post("/v1/jobs", json=spec())
            assert resp.status == 202, await resp.text()
            accepted = await resp.json()
            before = await client.get(f"/v1/jobs/{accepted['job_id']}")  # a linearizable read waits for it
            assert before.status == 200, await before.text()
            # Before the outage: every read says it was linearizable, and at which log position.
            assert before.headers[READ_HEADER] == "linearizable"
            assert before.headers[SEQ_HEADER] == str(accepted["seq"])
            await server.astop(remove_data=False)
            yield Outage(client, server, accepted["job_id"], accepted["seq"])
    finally:
        await log.close()
        await server.astop()


async def test_default_reads_refuse_and_stale_reads_answer_from_the_fold(outage: Outage) -> None:
    client, job_id = outage.client, outage.job_id
    refused = await client.get(f"/v1/jobs/{job_id}")
    assert refused.status == 503 and refused.headers["Retry-After"]
    problem = await refused.json()
    assert problem["type"].endswith("/log-unavailable")
    assert "stale=true" in problem["detail"]
    assert READ_HEADER not in refused.headers

    for asked in ("stale=true", "stale", "stale=1", "stale=TRUE"):
        resp = await client.get(f"/v1/jobs/{job_id}?{asked}")
        assert resp.status == 200, (asked, await resp.text())
        assert (await resp.json())["job_id"] == job_id
        assert resp.headers[READ_HEADER] == "stale"
        assert resp.headers[SEQ_HEADER] == str(outage.seq)
    for path in FOLD_READS:
        resp = await client.get(path.format(job=job_id), params={"stale": "true"})
        assert resp.status == 200, (path, await resp.text())
        assert (resp.headers[READ_HEADER], resp.headers[SEQ_HEADER]) == ("stale", str(outage.seq)), path
    # false and 0 are the default read: refused while the log is away
    for asked in ("false", "0"):
        assert (await client.get("/v1/nodes", params={"stale": asked})).status == 503


async def test_an_unreadable_stale_is_a_400_naming_it(outage: Outage) -> None:
    resp = await outage.client.get(f"/v1/jobs/{outage.job_id}", params={"stale": "maybe"})
    assert resp.status == 400
    problem = await resp.json()
    assert problem["field"] == "stale" and "maybe" in problem["detail"]


async def test_views_that_read_the_log_refuse_stale_saying_why(outage: Outage) -> None:
    for path in (
        f"/v1/jobs/{outage.job_id}/history",
        f"/v1/jobs/{outage.job_id}/logs",
        "/v1/history",
        "/v1/usage",
    ):
        resp = await outage.client.get(path, params={"stale": "true"})
        assert resp.status == 400, path
        problem = await resp.json()
        assert problem["field"] == "stale" and "event log itself" in problem["detail"], path


async def test_a_stale_read_still_waits_for_the_initial_replay(tmp_path: Path) -> None:
    """A half-replayed fold is not an old view, it is a wrong one: 503 even when asked for stale."""
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="stale-replay-test")
    try:
        await register_nodes(log)
        await server.astop(remove_data=False)
        async with test_utils.TestClient(test_utils.TestServer(build_app(log))) as client:
            resp = await client.get("/v1/nodes", params={"stale": "true"})
            assert resp.status == 503
            problem = await resp.json()
            assert problem["type"].endswith("/log-unavailable") and "replaying" in problem["detail"]
    finally:
        await log.close()
        await server.astop()


async def run_rally(client: Client, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``rally`` against the live API: the CLI blocks, so it runs in a thread while the loop serves."""
    monkeypatch.delenv("RALLY_TOKEN", raising=False)
    url = str(client.make_url("")).rstrip("/")
    code: int = await asyncio.to_thread(rally, [*argv, "--api-url", url])
    return code


async def test_rally_points_at_stale_and_reads_with_it(
    outage: Outage,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # no .rally/tokens.json of a local cluster here
    assert await run_rally(outage.client, ["jobs", "--all"], monkeypatch) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: the event log did not say where it ends") and "--stale" in err

    assert await run_rally(outage.client, ["jobs", "--all", "--json", "--stale"], monkeypatch) == EXIT_OK
    out = capsys.readouterr()
    assert [j["job_id"] for j in json.loads(out.out)["jobs"]] == [outage.job_id]
    assert f"last known view at log position {outage.seq}" in out.err

    assert await run_rally(outage.client, ["nodes", "--stale"], monkeypatch) == EXIT_OK
    assert "n1" in capsys.readouterr().out


def test_the_openapi_document_offers_stale_and_the_headers_where_they_apply() -> None:
    paths = openapi_document()["paths"]
    for path in FOLD_READS:
        get = paths[path.replace("{job}", "{job_id}")]["get"]
        assert "stale" in [p["name"] for p in get["parameters"]], path
        assert {SEQ_HEADER, READ_HEADER} <= set(get["responses"]["200"]["headers"]), path
        assert {"400", "503"} <= set(get["responses"]), path
    for path in ("/v1/jobs/{job_id}/history", "/v1/jobs/{job_id}/logs"):
        get = paths[path]["get"]
        assert "stale" not in [p["name"] for p in get.get("parameters", [])], path
        assert {SEQ_HEADER, READ_HEADER} <= set(get["responses"]["200"]["headers"]), path


def test_the_hint_is_only_for_commands_that_have_stale_and_did_not_use_it() -> None:
    refused = ApiError(503, {"type": "https://rallypoint.dev/problems/log-unavailable", "detail": "away"})
    assert "--stale" in error_line(refused, argparse.Namespace(stale=False))
    assert error_line(refused, argparse.Namespace(stale=True)) == "error: away"  # already stale: replaying
    assert error_line(refused, argparse.Namespace()) == "error: away"  # `rally show`: no --stale there
    other = ApiError(503, {"type": "https://rallypoint.dev/problems/not-visible", "detail": "behind"})
    assert error_line(other, argparse.Namespace(stale=False)) == "error: behind"
