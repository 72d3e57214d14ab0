"""The HTTP API in-process against a real NATS JetStream: what it appends, what it refuses, what it reads.

Every refusal is checked twice: the problem+json body names the field, and the stream's last
sequence did not move (nothing was appended).
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

from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobCancelled,
    JobCancelRequested,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
    subjects,
)
from rallypoint.infra import NatsServer
from rallypoint.jobs import job_id_for
from rallypoint.state import ClusterState

NODES = 4
GPUS_PER_NODE = 8
PROBLEM = "application/problem+json"

Client = test_utils.TestClient[web.Request, web.Application]


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "pretrain", "team": "nlp", "gpus": 16, "command": ["python", "train.py"]}
    body.update(overrides)
    return body


def node_event(i: int) -> NodeRegistered:
    gpus = tuple(
        GpuInfo(index=g, uuid=f"GPU-n{i}-{g}", memory_mib=81559, nvlink_domain=0)
        for g in range(GPUS_PER_NODE)
    )
    return NodeRegistered(
        node_id=f"n{i}",
        address=f"10.0.0.{i}",
        rack=f"r{i // 2}",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96000,
        memory_mib=1 << 20,
        agent_instance="test",
        at=1.0,
    )


async def register_nodes(log: EventLog) -> None:
    for i in range(NODES):
        await log.append(
            subjects.node_registration(f"n{i}"), node_event(i), msg_id=f"n{i}:0:NodeRegistered", source="test"
        )


async def recorded(log: EventLog) -> list[Recorded]:
    return [rec async for rec in log.replay()]


async def submitted(log: EventLog) -> list[JobSubmitted]:
    return [r.event for r in await recorded(log) if isinstance(r.event, JobSubmitted)]


async def wait_fold(client: Client, seq: int, timeout: float = 5.0) -> None:
    """Wait until the API's fold has applied ``seq`` (for events the test appended behind its back)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await (await client.get("/v1/state")).json()
        if state["seq"] >= seq:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"API fold did not reach seq {seq}")


@pytest.fixture
async def client(event_log: EventLog) -> AsyncIterator[Client]:
    await register_nodes(event_log)
    app = build_app(event_log, config=ApiConfig(source="test-api"))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def assert_problem(resp: Any, status: int, field: str | None) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == PROBLEM
    body: dict[str, Any] = await resp.json()
    assert body["status"] == status
    assert body["type"].startswith("https://") and body["title"] and body["detail"]
    if field is not None:
        assert body["field"] == field
        assert body["invalid_params"] == [{"name": field, "reason": body["detail"]}]
    return body


# --- submission -------------------------------------------------------------------------------------


async def test_submit_appends_exactly_one_job_submitted(client: Client, event_log: EventLog) -> None:
    before = await event_log.last_seq()
    resp = await client.post("/v1/jobs", json=spec(env={"NCCL_DEBUG": "INFO"}))
    assert resp.status == 202, await resp.text()
    body = await resp.json()
    job_id = body["job_id"]
    assert body["seq"] == before + 1
    assert body["state"] == "pending"
    assert body["links"]["self"] == f"/v1/jobs/{job_id}"
    assert resp.headers["Location"] == f"/v1/jobs/{job_id}"
    assert "Idempotent-Replayed" not in resp.headers

    records = await recorded(event_log)
    jobs = [r for r in records if isinstance(r.event, JobSubmitted)]
    assert len(jobs) == 1
    rec = jobs[0]
    assert isinstance(rec.event, JobSubmitted)
    assert rec.seq == body["seq"] and rec.subject == subjects.job(job_id)
    assert rec.event.spec.gpus_per_task == 8 and rec.event.spec.env == {"NCCL_DEBUG": "INFO"}
    assert rec.envelope["source"] == "test-api"
    assert rec.envelope["id"] == f"{job_id}:0:JobSubmitted"

    # Read-your-write: the 202 came after the fold applied the event.
    got = await client.get(f"/v1/jobs/{job_id}")
    assert got.status == 200
    job = await got.json()
    # no scheduler runs here: the job has no place in its order yet, only the API's placeholder reason
    assert job["state"] == "pending" and job["queue_position"] is None
    assert job["pending_reason"]["code"] == "AwaitingScheduler"
    assert job["world_size"] == 16 and job["allocation"] == []
    assert job["spec"]["command"] == ["python", "train.py"]


async def test_same_idempotency_key_gives_one_job(client: Client, event_log: EventLog) -> None:
    headers = {"Idempotency-Key": "ci-build-1234"}
    first = await client.post("/v1/jobs", json=spec(), headers=headers)
    second = await client.post("/v1/jobs", json=spec(), headers=headers)
    assert first.status == second.status == 202
    a, b = await first.json(), await second.json()
    assert a["job_id"] == b["job_id"] == job_id_for("nlp", "ci-build-1234")
    assert a["seq"] == b["seq"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert len(await submitted(event_log)) == 1

    # Another team's identical key is another job.
    other = await client.post("/v1/jobs", json=spec(team="vision"), headers=headers)
    assert (await other.json())["job_id"] != a["job_id"]
    assert len(await submitted(event_log)) == 2


async def test_concurrent_retries_make_one_job(client: Client, event_log: EventLog) -> None:
    headers = {"Idempotency-Key": "retry-storm"}
    posts = (client.post("/v1/jobs", json=spec(), headers=headers) for _ in range(10))
    responses = await asyncio.gather(*posts)
    bodies = [await r.json() for r in responses]
    assert {r.status for r in responses} == {202}
    assert len({b["job_id"] for b in bodies}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 9
    assert len(await submitted(event_log)) == 1


async def test_reused_key_with_another_spec_is_refused(client: Client, event_log: EventLog) -> None:
    headers = {"Idempotency-Key": "k1"}
    assert (await client.post("/v1/jobs", json=spec(), headers=headers)).status == 202
    before = await event_log.last_seq()
    resp = await client.post("/v1/jobs", json=spec(gpus=8), headers=headers)
    await assert_problem(resp, 422, "idempotency_key")
    assert await event_log.last_seq() == before


INVALID: list[tuple[str, Any, int, str]] = [
    ("zero gpus", spec(gpus=0), 422, "gpus"),
    ("larger than the cluster", spec(gpus=999, gpus_per_task=1), 422, "gpus"),
    ("bad name", spec(name="My Job!"), 422, "name"),
    ("unknown field", spec(gpu_count=4), 422, "gpu_count"),
    ("wrong type", spec(gpus="16"), 422, "gpus"),
    ("missing command", {"name": "x", "team": "nlp", "gpus": 8}, 422, "command"),
    ("one type and several", spec(gpu_type="H100", gpu_types=["A100"]), 422, "gpu_types"),
    ("not an object", [1, 2], 422, "body"),
    ("bad json", b'{"name": "x", gpus: }', 400, "body"),
    ("empty body", b"", 400, "body"),
]


@pytest.mark.parametrize(("case", "payload", "status", "field"), INVALID, ids=[c[0] for c in INVALID])
async def test_invalid_submission_appends_nothing(
    client: Client, event_log: EventLog, case: str, payload: Any, status: int, field: str
) -> None:
    before = await event_log.last_seq()
    if isinstance(payload, bytes):
        resp = await client.post("/v1/jobs", data=payload, headers={"Content-Type": "application/json"})
    else:
        resp = await client.post("/v1/jobs", json=payload)
    body = await assert_problem(resp, status, field)
    if case == "larger than the cluster":
        assert body["detail"] == "asks for 999 GPUs; the cluster has 32"
    assert await event_log.last_seq() == before


NOT_JSON = [
    ("text/plain", json.dumps(spec()).encode()),
    ("application/x-www-form-urlencoded", b"name=x&team=nlp&gpus=8"),
    (
        "multipart/form-data; boundary=b",
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--b--\r\n',
    ),
    (None, json.dumps(spec()).encode()),  # no Content-Type at all
]


@pytest.mark.parametrize(("content_type", "body"), NOT_JSON, ids=[str(c[0]) for c in NOT_JSON])
async def test_a_body_that_is_not_sent_as_json_is_refused_with_415(
    client: Client, event_log: EventLog, content_type: str | None, body: bytes
) -> None:
    before = await event_log.last_seq()
    headers = {} if content_type is None else {"Content-Type": content_type}
    # skip_auto_headers: aiohttp would otherwise label raw bytes application/octet-stream itself
    resp = await client.post("/v1/jobs", data=body, headers=headers, skip_auto_headers=["Content-Type"])
    problem = await assert_problem(resp, 415, None)
    assert "application/json" in problem["detail"]
    assert await event_log.last_seq() == before


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"name": "a", "team": "nlp", "gpus": 8, "command": ["x"], "gpus": 16}', "gpus"),
        (b'{"name": "a", "team": "nlp", "gpus": 8, "command": ["x"], "env": {"A": "1", "A": "2"}}', "env.A"),
    ],
)
async def test_duplicate_json_keys_are_refused_naming_the_key(
    client: Client, event_log: EventLog, raw: bytes, key: str
) -> None:
    before = await event_log.last_seq()
    resp = await client.post("/v1/jobs", data=raw, headers={"Content-Type": "application/json"})
    problem = await assert_problem(resp, 400, "body")
    assert f"duplicate key {key!r}" in problem["detail"]
    assert await event_log.last_seq() == before


async def test_size_check_skipped_before_any_node_registers(event_log: EventLog) -> None:
    async with test_utils.TestClient(test_utils.TestServer(build_app(event_log))) as c:
        resp = await c.post("/v1/jobs", json=spec(gpus=4096))
        assert resp.status == 202
        # Shapes are still checked against the default node size.
        await assert_problem(
            await c.post("/v1/jobs", json=spec(gpus=16, gpus_per_task=16)), 422, "gpus_per_task"
        )


async def test_cloudevents_structured_submission(client: Client, event_log: EventLog) -> None:
    envelope = {
        "specversion": "1.0",
        "id": "gh-run-77-attempt-1",
        "source": "https://github.com/acme/llm",
        "type": "io.rallypoint.job.submit",
        "datacontenttype": "application/json",
        "data": spec(name="ci-eval", gpus=8),
    }
    headers = {"Content-Type": "application/cloudevents+json; charset=utf-8"}
    resp = await client.post("/v1/jobs", data=json.dumps(envelope), headers=headers)
    assert resp.status == 202, await resp.text()
    body = await resp.json()
    assert body["job_id"] == job_id_for("nlp", "gh-run-77-attempt-1")
    again = await client.post("/v1/jobs", data=json.dumps(envelope), headers=headers)
    assert (await again.json())["job_id"] == body["job_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    jobs = await submitted(event_log)
    assert len(jobs) == 1 and jobs[0].spec.name == "ci-eval"
    assert jobs[0].idempotency_key == "gh-run-77-attempt-1"

    before = await event_log.last_seq()

    async def post_ce(event: dict[str, Any]) -> Any:
        return await client.post("/v1/jobs", data=json.dumps(event), headers=headers)

    await assert_problem(await post_ce({k: v for k, v in envelope.items() if k != "data"}), 422, "data")
    await assert_problem(await post_ce({**envelope, "id": "other", "data": spec(gpus=0)}), 422, "gpus")
    await assert_problem(await post_ce({k: v for k, v in envelope.items() if k != "id"}), 422, "id")
    assert await event_log.last_seq() == before


async def test_cloudevents_binary_mode_uses_ce_id(client: Client) -> None:
    headers = {"ce-specversion": "1.0", "ce-id": "evt-9", "ce-source": "jenkins", "ce-type": "submit"}
    resp = await client.post("/v1/jobs", json=spec(), headers=headers)
    assert (await resp.json())["job_id"] == job_id_for("nlp", "evt-9")


# --- reading ----------------------------------------------------------------------------------------


async def test_get_unknown_job_is_404(client: Client) -> None:
    await assert_problem(await client.get("/v1/jobs/j-000000000000"), 404, None)
    await assert_problem(await client.get("/v1/jobs/not.a.token"), 404, None)


async def test_list_jobs_filters_and_pages(client: Client) -> None:
    ids = []
    for name, team in [("a", "nlp"), ("b", "vision"), ("c", "nlp")]:
        resp = await client.post("/v1/jobs", json=spec(name=name, team=team, gpus=8))
        ids.append((await resp.json())["job_id"])

    everything = await (await client.get("/v1/jobs")).json()
    assert [j["job_id"] for j in everything["jobs"]] == ids  # submission order
    assert [j["queue_position"] for j in everything["jobs"]] == [None, None, None]  # no scheduler here

    nlp = await (await client.get("/v1/jobs", params={"team": "nlp"})).json()
    assert [j["name"] for j in nlp["jobs"]] == ["a", "c"]

    page = await (await client.get("/v1/jobs", params={"limit": "2"})).json()
    assert page["count"] == 2 and page["next_after"] is not None
    rest = await (await client.get("/v1/jobs", params={"after": str(page["next_after"])})).json()
    assert [j["job_id"] for j in rest["jobs"]] == ids[2:] and rest["next_after"] is None

    running = await (await client.get("/v1/jobs", params={"state": "running,completed"})).json()
    assert running["jobs"] == []
    await assert_problem(await client.get("/v1/jobs", params={"state": "sleeping"}), 400, "state")
    await assert_problem(await client.get("/v1/jobs", params={"limit": "0"}), 400, "limit")
    await assert_problem(await client.get("/v1/jobs", params={"limit": "ten"}), 400, "limit")


async def test_bound_job_shows_allocation_and_nodes(client: Client, event_log: EventLog) -> None:
    job_id = (await (await client.post("/v1/jobs", json=spec(gpus=16))).json())["job_id"]
    placements = (
        TaskPlacement(task=0, node_id="n0", gpus=tuple(range(8))),
        TaskPlacement(task=1, node_id="n1", gpus=tuple(range(8))),
    )
    # the fold counts only the current scheduler epoch's binds
    await event_log.append(
        subjects.EPOCH, LeaderEpochStarted(epoch=1, leader_id="s", at=1.0), msg_id="epoch:1", source="test"
    )
    seq = await event_log.append(
        subjects.bind(job_id),
        GangBound(
            job_id=job_id,
            attempt=1,
            epoch=1,
            placements=placements,
            computed_at_seq=5,
            policy_version="test",
            now=2.0,
            at=2.0,
        ),
        msg_id=f"{job_id}:1:GangBound",
        source="test",
    )
    await wait_fold(client, seq)
    job = await (await client.get(f"/v1/jobs/{job_id}")).json()
    assert job["state"] == "bound" and job["attempt"] == 1 and job["bound_at"] == 2.0
    assert job["allocation"] == [
        {"task": 0, "node_id": "n0", "gpus": list(range(8))},
        {"task": 1, "node_id": "n1", "gpus": list(range(8))},
    ]
    assert job["pending_reason"] is None and job["queue_position"] is None

    nodes = (await (await client.get("/v1/nodes")).json())["nodes"]
    assert [n["node_id"] for n in nodes] == ["n0", "n1", "n2", "n3"]
    assert nodes[0]["gpus"] == {"total": 8, "free": 0, "allocated": 8} and nodes[0]["jobs"] == [job_id]
    assert nodes[2]["gpus"]["free"] == 8 and nodes[2]["jobs"] == [] and nodes[2]["status"] == "up"
    assert nodes[0]["rack"] == "r0" and nodes[0]["gpu_type"] == "H100"


# --- cancellation -----------------------------------------------------------------------------------


async def test_cancel_appends_cancel_requested(client: Client, event_log: EventLog) -> None:
    job_id = (await (await client.post("/v1/jobs", json=spec())).json())["job_id"]
    resp = await client.delete(f"/v1/jobs/{job_id}")
    assert resp.status == 202
    body = await resp.json()
    assert body["cancel_requested"] is True
    cancels = [r for r in await recorded(event_log) if isinstance(r.event, JobCancelRequested)]
    assert len(cancels) == 1 and cancels[0].seq == body["seq"]
    assert cancels[0].subject == subjects.job(job_id) and cancels[0].envelope["id"] == f"{job_id}:cancel"

    job = await (await client.get(f"/v1/jobs/{job_id}")).json()
    assert job["cancel_requested"] is True and job["pending_reason"]["code"] == "CancelRequested"

    # The controller finishes it; a cancel of a finished job is a conflict.
    seq = await event_log.append(
        subjects.job_control(job_id),
        JobCancelled(job_id=job_id, at=3.0),
        msg_id=f"{job_id}:0:JobCancelled",
        source="test",
    )
    await wait_fold(client, seq)
    before = await event_log.last_seq()
    body409 = await assert_problem(await client.delete(f"/v1/jobs/{job_id}"), 409, None)
    assert body409["state"] == "cancelled"
    await assert_problem(await client.delete("/v1/jobs/j-ffffffffffff"), 404, None)
    assert await event_log.last_seq() == before


# --- state, operations --------------------------------------------------------------------------------


async def test_state_hash_matches_a_fresh_replay(client: Client, event_log: EventLog) -> None:
    for i in range(3):
        await client.post("/v1/jobs", json=spec(name=f"job-{i}", gpus=8))
    job_id = (await (await client.get("/v1/jobs")).json())["jobs"][0]["job_id"]
    await client.delete(f"/v1/jobs/{job_id}")

    state = await (await client.get("/v1/state")).json()
    assert state["seq"] == await event_log.last_seq()
    fresh = ClusterState()
    async for rec in event_log.replay(to_seq=state["seq"]):
        fresh.apply(rec.seq, rec.event)
    assert state["hash"] == fresh.hash()


async def test_health_metrics_and_openapi(client: Client) -> None:
    await client.post("/v1/jobs", json=spec())
    # /metrics reports the fold as it is (it does not wait for it, as reads do): a read first, which waits
    # until the fold holds the submission the log acknowledged
    assert (await client.get("/v1/jobs")).status == 200
    health = await client.get("/healthz")
    assert health.status == 200 and (await health.json())["status"] == "ok"

    metrics = await client.get("/metrics")
    text = await metrics.text()
    assert metrics.content_type == "text/plain"
    assert 'rally_jobs{state="pending"} 1' in text
    assert 'rally_jobs{state="running"} 0' in text
    # nodes and GPUs are counted once, by the schedulers (rally_nodes, rally_gpus), not again here
    assert "rally_nodes" not in text and "rally_gpus" not in text
    assert "rally_log_fold_seq " in text and "_created" not in text
    assert 'rally_api_submissions_total{outcome="accepted"} 1' in text

    doc = await (await client.get("/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in client.app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops if m != "parameters"}
    assert served == documented


async def test_unknown_routes_and_methods_are_problems(client: Client) -> None:
    await assert_problem(await client.get("/v2/nothing"), 404, None)
    resp = await client.put("/v1/jobs")
    await assert_problem(resp, 405, None)
    assert "POST" in resp.headers["Allow"]


async def test_log_down_is_503_never_success(tmp_path: Path) -> None:
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="api-503")
    try:
        await register_nodes(log)
        async with test_utils.TestClient(test_utils.TestServer(build_app(log))) as c:
            assert (await c.get("/v1/state")).status == 200  # waits for the initial replay
            assert (await c.get("/healthz")).status == 200
            await server.astop(remove_data=False)
            resp = await c.post("/v1/jobs", json=spec())
            body = await assert_problem(resp, 503, None)
            assert "Idempotency-Key" in body["detail"]
            assert resp.headers["Retry-After"]
    finally:
        await log.close()
        await server.astop()
