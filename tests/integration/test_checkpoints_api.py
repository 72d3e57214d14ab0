"""`GET /v1/jobs/{id}/checkpoints` and `rally checkpoints JOB`, over the real API on a real NATS log.

The answer to "what is job X's latest complete checkpoint" comes from the log: the test appends the
checkpoint events a node agent and the checkpoint service would, and reads them back through the API
and through the CLI (which talks HTTP to the same app, served on a real port).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.app import FOLLOWER

from rallypoint.cli.checkpoint_cmds import format_size
from rallypoint.cli.main import main
from rallypoint.eventlog import EventLog
from rallypoint.events import (
    CheckpointCommitted,
    CheckpointDeleted,
    CheckpointEvent,
    CheckpointVerified,
    JobSpec,
    JobSubmitted,
    subjects,
)

Client = test_utils.TestClient[web.Request, web.Application]
JOB = "j-ckpt"


def committed(step: int) -> CheckpointCommitted:
    return CheckpointCommitted(
        job_id=JOB,
        attempt=1 if step < 300 else 2,
        step=step,
        path=f"/ckpt/{JOB}/step-{step:012d}",
        manifest_sha256=f"{step:064x}",
        bytes=3 * 1024**3,
        shards=16,
        save_s=4.25,
        node_id="n0",
        at=1_700_000_000.0 + step,
    )


async def append(log: EventLog, event: CheckpointEvent | JobSubmitted, msg_id: str) -> int:
    return await log.append(subjects.for_event(event), event, msg_id=msg_id, source="test")


@pytest.fixture
async def client(event_log: EventLog) -> AsyncIterator[Client]:
    """The API over a job with four steps: 100 deleted, 200 verified, 300 corrupt, 400 committed."""
    spec = JobSpec(name="train", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("true",))
    await append(event_log, JobSubmitted(job_id=JOB, spec=spec, submitted_at=1.0), "submit")
    for step in (100, 200, 300, 400):
        await append(event_log, committed(step), f"c{step}")
    await append(event_log, CheckpointVerified(job_id=JOB, step=100, ok=True, at=2.0), "v100")
    await append(event_log, CheckpointVerified(job_id=JOB, step=200, ok=True, at=2.0), "v200")
    await append(
        event_log,
        CheckpointVerified(job_id=JOB, step=300, ok=False, error="shard 3: bad sha256", at=2.0),
        "v3",
    )
    await append(event_log, CheckpointDeleted(job_id=JOB, step=100, reason="retention: old", at=3.0), "d1")
    app = build_app(event_log, config=ApiConfig(source="test-api"))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def test_checkpoints_endpoint_lists_every_step_and_the_latest_complete(client: Client) -> None:
    resp = await client.get(f"/v1/jobs/{JOB}/checkpoints")

    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["job_id"] == JOB and body["seq"] == 9
    # 400 is only committed (not yet verified) and still complete: a restart resumes from it.
    assert body["latest_complete"] == 400
    assert [(c["step"], c["status"], c["error"]) for c in body["checkpoints"]] == [
        (100, "deleted", "retention: old"),
        (200, "verified", None),
        (300, "corrupt", "shard 3: bad sha256"),
        (400, "committed", None),
    ]
    assert body["checkpoints"][3] == {
        "step": 400,
        "attempt": 2,
        "path": f"/ckpt/{JOB}/step-000000000400",
        "bytes": 3 * 1024**3,
        "shards": 16,
        "save_s": 4.25,
        "committed_at": 1_700_000_400.0,
        "manifest_sha256": f"{400:064x}",
        "status": "committed",
        "error": None,
    }


async def test_latest_complete_skips_newer_corrupt_steps(client: Client, event_log: EventLog) -> None:
    # Past the API's initial replay first: an event that replay folds wakes no waiter.
    assert await client.app[FOLLOWER].wait_caught_up(5.0)
    seq = await append(event_log, CheckpointVerified(job_id=JOB, step=400, ok=False, error="x", at=4.0), "v4")
    assert await client.app[FOLLOWER].wait_for_seq(seq, 5.0)

    body = await (await client.get(f"/v1/jobs/{JOB}/checkpoints")).json()

    assert body["latest_complete"] == 200


async def test_unknown_job_is_404_problem(client: Client) -> None:
    resp = await client.get("/v1/jobs/j-nope/checkpoints")

    assert resp.status == 404
    assert resp.content_type == "application/problem+json"
    assert (await resp.json())["detail"] == "job 'j-nope' does not exist"


async def test_the_cli_prints_a_table_marking_the_latest_complete(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(client.make_url("")).rstrip("/")

    code = await asyncio.to_thread(main, ["checkpoints", JOB, "--api-url", url])

    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].split() == ["STEP", "ATTEMPT", "STATUS", "SIZE", "SHARDS", "SAVE", "COMMITTED", "ERROR"]
    rows = {line.split()[0] if not line.startswith("*") else line.split()[1]: line for line in out[1:5]}
    assert rows["400"].startswith("*") and "COMMITTED" in rows["400"] and "3.0 GiB" in rows["400"]
    assert "4.2s" in rows["400"] or "4.3s" in rows["400"]
    assert not rows["200"].startswith("*") and "VERIFIED" in rows["200"]
    assert "CORRUPT" in rows["300"] and "shard 3: bad sha256" in rows["300"]
    assert out[5] == "* latest complete: step 400 (a restart resumes from it)"


async def test_the_cli_json_is_the_api_body(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(client.make_url("")).rstrip("/")

    code = await asyncio.to_thread(main, ["checkpoints", JOB, "--json", "--api-url", url])

    body = json.loads(capsys.readouterr().out)
    assert code == 0 and body["latest_complete"] == 400 and len(body["checkpoints"]) == 4


async def test_the_cli_says_clearly_when_the_job_is_unknown(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(client.make_url("")).rstrip("/")

    code = await asyncio.to_thread(main, ["checkpoints", "j-nope", "--api-url", url])

    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == "error: no job 'j-nope' (list jobs with `rally jobs --all`)"


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 * 1024**3, "3.0 GiB"), (5 * 1024**5, "5120.0 TiB")],
)
def test_sizes(size: int, text: str) -> None:
    assert format_size(size) == text
