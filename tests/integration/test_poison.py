"""Poison in the log, on a real nats-server: `b"\\x00junk"` and a well-formed `JobSubmitted.v2` published raw
on `rally.job.x`, as measured on the live cluster in issue 14.

The API (in-process, over the real stream) keeps folding past both, answers 202 only for jobs its fold
holds, reports the newer version in /healthz and counts both in /metrics; its state hash equals a fresh
`rally replay`; `rally replay`, `--export` and `--verify-decisions` work and list the quarantined seqs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.app import FOLLOWER

from rallypoint.cli.main import main as rally
from rallypoint.cli.replay import replay_state
from rallypoint.eventlog import EventLog
from rallypoint.events import GpuInfo, NodeRegistered, subjects
from rallypoint.infra import NatsServer

Client = test_utils.TestClient[web.Request, web.Application]

JUNK = b"\x00junk"
V2 = b'{"type":"JobSubmitted.v2","job_id":"j-v2","spec":{"name":"x"},"submitted_at":1.0,"band":3}'
SPEC = {"name": "after-poison", "team": "nlp", "gpus": 8, "command": ["python", "train.py"]}


async def publish_raw(log: EventLog, data: bytes) -> int:
    """Straight into the stream, past every writer of ours: what a broken or newer client does."""
    ack = await log.js.publish("rally.job.x", data, stream=log.stream)
    return int(ack.seq)


async def register_node(log: EventLog, node_id: str) -> int:
    gpus = tuple(GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(8))
    event = NodeRegistered(
        node_id=node_id,
        address="10.0.0.1",
        rack="r0",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96000,
        memory_mib=1 << 20,
        agent_instance="test",
        at=1.0,
    )
    return await log.append(subjects.node(node_id), event, msg_id=f"{node_id}:reg", source="test")


async def wait_fold(client: Client, seq: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state: dict[str, Any] = await (await client.get("/v1/state")).json()
        if state["seq"] >= seq:
            return state
        await asyncio.sleep(0.02)
    raise AssertionError(f"the API's fold never reached seq {seq}")


@pytest.fixture
async def poisoned(event_log: EventLog) -> list[int]:
    """A node, then junk: the API starts on a log that already holds poison (its catch-up path)."""
    await register_node(event_log, "n0")
    return [await publish_raw(event_log, JUNK)]


@pytest.fixture
async def client(event_log: EventLog, poisoned: list[int]) -> AsyncIterator[Client]:
    app = build_app(event_log, config=ApiConfig(source="test-api"))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def test_the_api_folds_past_poison_and_agrees_with_a_fresh_replay(
    client: Client, event_log: EventLog, poisoned: list[int], nats_server: NatsServer
) -> None:
    await wait_fold(client, poisoned[0])
    poisoned.append(await publish_raw(event_log, V2))  # while the API follows (its live path)

    resp = await client.post("/v1/jobs", json=SPEC)
    assert resp.status == 202, await resp.text()
    accepted = await resp.json()
    assert accepted["seq"] > poisoned[-1]
    job = await client.get(f"/v1/jobs/{accepted['job_id']}")
    assert job.status == 200 and (await job.json())["state"] == "pending"

    live = await wait_fold(client, accepted["seq"])
    fresh = await replay_state(nats_server.url, None)
    assert (fresh["seq"], fresh["hash"]) == (live["seq"], live["hash"])
    assert [q["seq"] for q in fresh["quarantined"]] == poisoned  # type: ignore[attr-defined]


async def test_health_reports_the_newer_version_and_metrics_count_the_poison(
    client: Client, event_log: EventLog, poisoned: list[int]
) -> None:
    await wait_fold(client, poisoned[0])
    health = await (await client.get("/healthz")).json()
    assert health["status"] == "ok" and health["degraded"] == []

    v2 = await publish_raw(event_log, V2)
    await wait_fold(client, v2)
    resp = await client.get("/healthz")
    health = await resp.json()
    assert resp.status == 200 and health["status"] == "degraded"
    assert len(health["degraded"]) == 1
    assert "JobSubmitted.v2" in health["degraded"][0] and f"seq {v2}" in health["degraded"][0]

    metrics = await (await client.get("/metrics")).text()
    assert 'rally_events_quarantined_total{reason="undecodable"} 1' in metrics
    assert 'rally_events_quarantined_total{reason="newer-version"} 1' in metrics
    assert 'rally_events_quarantined_total{reason="invalid"} 0' in metrics


async def test_no_202_for_a_job_the_fold_cannot_see(
    client: Client, event_log: EventLog, poisoned: list[int]
) -> None:
    await wait_fold(client, poisoned[0])
    follower = client.app[FOLLOWER]
    await follower.stop()  # the fold is stuck, as it was behind a poison message before this fix
    resp = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "stuck-1"})
    assert resp.status == 503, await resp.text()
    problem = await resp.json()
    assert problem["type"].endswith("/not-visible") and resp.headers["Retry-After"]
    job_id = problem["job_id"]
    assert resp.headers["Location"] == f"/v1/jobs/{job_id}"
    assert problem["seq"] == await event_log.last_seq()  # it is in the log, just not visible here

    follower.start()
    await wait_fold(client, problem["seq"])
    retry = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "stuck-1"})
    assert retry.status == 202 and (await retry.json())["job_id"] == job_id
    assert (await client.get(f"/v1/jobs/{job_id}")).status == 200


# --- rally replay over a poisoned log ------------------------------------------------------------------


async def rally_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`rally ARGV` in-process (its asyncio.run in a worker thread); exit code and stdout."""
    capsys.readouterr()
    code = await asyncio.to_thread(rally, list(argv))
    return code, capsys.readouterr().out


async def test_rally_replay_export_and_verify_list_the_quarantined_seqs(
    client: Client,
    event_log: EventLog,
    poisoned: list[int],
    nats_server: NatsServer,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    poisoned.append(await publish_raw(event_log, V2))
    resp = await client.post("/v1/jobs", json=SPEC)
    assert resp.status == 202, await resp.text()
    live = await wait_fold(client, (await resp.json())["seq"])
    url = nats_server.url

    code, out = await rally_cli(capsys, "replay", "--nats-url", url, "--json")
    summary = json.loads(out)
    assert code == 0 and (summary["seq"], summary["hash"]) == (live["seq"], live["hash"])
    assert [q["seq"] for q in summary["quarantined"]] == poisoned
    assert [q["reason"] for q in summary["quarantined"]] == ["undecodable", "newer-version"]

    code, out = await rally_cli(capsys, "replay", "--nats-url", url)
    assert code == 0 and live["hash"] in out
    assert all(f"seq {seq} on rally.job.x" in out for seq in poisoned)

    export = tmp_path / "history.jsonl"
    code, out = await rally_cli(capsys, "replay", "--nats-url", url, "--export", str(export))
    assert code == 0 and f"seq {', '.join(map(str, poisoned))}" in out
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert [line["seq"] for line in lines] == list(range(1, live["seq"] + 1))
    assert [line["seq"] for line in lines if "quarantined" in line] == poisoned

    code, out = await rally_cli(capsys, "replay", "--history", str(export), "--json")
    assert code == 0 and json.loads(out)["hash"] == live["hash"]

    code, out = await rally_cli(capsys, "replay", "--nats-url", url, "--verify-decisions")
    assert code == 0, out
    assert f"seq {', '.join(map(str, poisoned))}" in out and live["hash"] in out
