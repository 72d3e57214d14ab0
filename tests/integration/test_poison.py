"""Poison in the log, on a real nats-server: `b"\\x00junk"` and a well-formed `JobSubmitted.v2` published raw
on `rally.job.x`, as measured on the live cluster in issue 14. Nothing here mocks the bus.

- The API (in-process, over the real stream) keeps folding past both, answers 202 only for jobs its fold
  holds, reports the newer version in /healthz and counts both in /metrics; its state hash equals a fresh
  `rally replay`; `rally replay`, `--export` and `--verify-decisions` work and list the quarantined seqs.
- Real service processes (`rally serve scheduler`, `rally serve inventory`, each on a nats-server of its
  own, since services restore shared snapshots) fold past both, act on what comes after, restart without
  crash-looping and say in /healthz which newer event version they meet.
- The projector, on a real PostgreSQL, archives both as `quarantined` rows and goes on.
- Bad input to the API is a problem naming the field, never a 500, and appends nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import nats.errors
import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.fold import FoldFollower

from rallypoint.cli.main import main as rally
from rallypoint.cli.replay import replay_state
from rallypoint.eventlog import EventLog, stored
from rallypoint.events import GangBound, GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import ManagedProcess, NatsServer, PostgresServer, free_port
from rallypoint.projection import SCHEMA, Projector, connect, fetch_archive_seqs, fetch_jobs, job_row
from rallypoint.state import ClusterState

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
        at=time.time(),
    )
    return await log.append(
        subjects.node_registration(node_id), event, msg_id=f"{node_id}:reg", source="test"
    )


async def submit(log: EventLog, job_id: str) -> int:
    """A job appended the way the API appends it."""
    spec = JobSpec(name=job_id, team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("true",))
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())
    return await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


async def fresh_fold(log: EventLog) -> ClusterState:
    state = ClusterState()
    async for rec in log.replay(quarantine=True):
        state.apply_stored(rec.seq, stored(rec))
    return state


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


async def test_no_404_for_a_job_accepted_while_the_fold_cannot_see_it(
    event_log: EventLog, poisoned: list[int], nats_server: NatsServer
) -> None:
    # The fold reads through a connection of its own, which then goes away: the fold is stuck, as it
    # was behind a poison message before issue 14, while appends still succeed. The submission is
    # answered once the log acknowledged it (202: it is durably there); this instance's reads wait for
    # its own writes and answer 503 not-visible rather than a 404 for the job it accepted.
    fold_log = await EventLog.connect(nats_server.url, name="test-stuck-fold", create=False)
    follower = FoldFollower(fold_log)
    config = ApiConfig(source="test-api", fold_wait_s=0.5, ready_wait_s=0.5)
    app = build_app(event_log, config=config, follower=follower)
    async with test_utils.TestClient(test_utils.TestServer(app)) as stuck:
        await wait_fold(stuck, poisoned[0])
        await fold_log.close()
        resp = await stuck.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "stuck-1"})
        assert resp.status == 202, await resp.text()
        accepted = await resp.json()
        job_id = accepted["job_id"]
        assert resp.headers["Location"] == f"/v1/jobs/{job_id}"
        read = await stuck.get(f"/v1/jobs/{job_id}")
        assert read.status == 503, await read.text()
        assert (await read.json())["type"].endswith("/not-visible") and read.headers["Retry-After"]
    recorded = await event_log.get(accepted["seq"])  # the log has it: a retry finds it, creates nothing
    assert isinstance(recorded.event, JobSubmitted) and recorded.event.job_id == job_id

    async with test_utils.TestClient(test_utils.TestServer(build_app(event_log))) as healthy:
        retry = await healthy.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "stuck-1"})
        assert retry.status == 202 and retry.headers["Idempotent-Replayed"] == "true"
        assert (await retry.json())["job_id"] == job_id
        assert (await healthy.get(f"/v1/jobs/{job_id}")).status == 200


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


# --- real service processes ---------------------------------------------------------------------------


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    nats = await NatsServer(tmp_path / "nats").astart()
    try:
        yield nats
    finally:
        await nats.astop()


@pytest.fixture
async def log(server: NatsServer) -> AsyncIterator[EventLog]:
    event_log = await EventLog.connect(server.url, name="test-poison-services")
    try:
        yield event_log
    finally:
        await event_log.close()


class Service:
    """`rally serve NAME` as its own process, with /healthz on a free port."""

    def __init__(self, name: str, url: str, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.argv = [sys.executable, "-m", "rallypoint.cli.serve", name, "--nats-url", url]
        self.argv += ["--instance", f"{name}-1", "--health-port", str(self.port)]
        self.log_path = workdir / f"{name}.log"
        self.proc = self.start()

    def start(self) -> ManagedProcess:
        return ManagedProcess(self.argv, log_path=self.log_path)

    def restart(self) -> None:
        self.proc.stop()
        self.proc = self.start()

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture
def services(server: NatsServer, tmp_path: Path) -> Iterator[Callable[[str], Service]]:
    started: list[Service] = []

    def start(name: str) -> Service:
        started.append(Service(name, server.url, tmp_path))
        return started[-1]

    try:
        yield start
    finally:
        for service in started:
            service.proc.stop()


async def eventually(check: Callable[[], Any], what: str, service: Service, timeout: float = 30.0) -> Any:
    """``check()``'s first truthy answer; a service that died or never got there fails with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.proc.running():
            pytest.fail(f"{service.name} died waiting for {what}:\n{service.proc.log_tail()}")
        try:
            answer = await asyncio.to_thread(check)
        except OSError:
            answer = None
        if answer:
            return answer
        await asyncio.sleep(0.2)
    pytest.fail(f"{service.name}: no {what} within {timeout:.0f}s:\n{service.proc.log_tail()}")


async def until_bound(log: EventLog, job_id: str, scheduler: Service, timeout: float = 30.0) -> None:
    """Until the scheduler appended a GangBound for ``job_id``: it folded the job, past any poison."""
    deadline = time.monotonic() + timeout
    while True:
        binds = [rec.event async for rec in log.replay(subjects=subjects.SCHEDULER_TREE)]
        if any(isinstance(e, GangBound) and e.job_id == job_id for e in binds):
            return
        assert scheduler.proc.running(), scheduler.proc.log_tail()
        assert time.monotonic() < deadline, f"{job_id} never bound:\n{scheduler.proc.log_tail()}"
        await asyncio.sleep(0.2)


def degraded_for_v2(service: Service) -> bool:
    status, body = service.get("/healthz")
    return status == 200 and body["status"] == "degraded" and "JobSubmitted.v2" in " ".join(body["degraded"])


async def test_the_scheduler_binds_past_poison_restarts_and_says_it_is_degraded(
    log: EventLog, services: Callable[[str], Service]
) -> None:
    await register_node(log, "n0")
    await publish_raw(log, JUNK)  # already in the log when the scheduler starts: its catch-up path
    scheduler = services("scheduler")
    await eventually(lambda: scheduler.get("/healthz")[1]["status"] == "ok", "healthy start", scheduler)

    v2 = await publish_raw(log, V2)  # while it follows: the live path
    await submit(log, "j-after")
    await until_bound(log, "j-after", scheduler)

    await eventually(lambda: degraded_for_v2(scheduler), "degraded health", scheduler)
    status, body = scheduler.get("/readyz")
    assert status == 503 and body["status"] == "degraded" and f"seq {v2}" in body["degraded"][0]
    assert f"quarantined the message at seq {v2} on rally.job.x" in scheduler.proc.log_tail(100_000)

    # A restart catches up over both messages again instead of crash-looping, and still binds.
    scheduler.restart()
    await eventually(lambda: degraded_for_v2(scheduler), "degraded health after a restart", scheduler)
    await register_node(log, "n1")
    await submit(log, "j-after-restart")
    await until_bound(log, "j-after-restart", scheduler)


async def test_the_inventory_answers_with_nodes_registered_after_poison(
    log: EventLog, services: Callable[[str], Service]
) -> None:
    await register_node(log, "n0")
    await publish_raw(log, JUNK)
    inventory = services("inventory")
    await eventually(lambda: inventory.get("/healthz")[1]["status"] == "ok", "healthy start", inventory)
    await publish_raw(log, V2)
    await register_node(log, "n1")

    async def nodes() -> set[str]:
        # A loaded full run still saw no responders just after /healthz said ok, with the readiness check
        # in place: no responders yet is "not yet", as a slow answer is.
        try:
            reply = await log.nc.request(subjects.query("inventory", "nodes"), b"", timeout=2)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return set()
        view = msgspec.json.decode(reply.data)
        return {n["node_id"] for n in view["nodes"]}

    deadline = time.monotonic() + 30
    while await nodes() != {"n0", "n1"}:
        assert time.monotonic() < deadline, inventory.proc.log_tail()
        await asyncio.sleep(0.2)
    await eventually(lambda: degraded_for_v2(inventory), "degraded health", inventory)


# --- the projector on PostgreSQL -------------------------------------------------------------------------


@pytest.fixture
async def db(postgres: PostgresServer) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A fresh database on the session's PostgreSQL, and a connection to look at it."""
    name = f"poison_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres.dsn_for("postgres"))
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    conn = await connect(postgres.dsn_for(name), application_name="test-poison")
    try:
        yield postgres.dsn_for(name), conn
    finally:
        await conn.close()
        admin = await asyncpg.connect(postgres.dsn_for("postgres"))
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


async def test_the_projector_archives_poison_as_quarantined_and_goes_on(
    event_log: EventLog, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    await register_node(event_log, "n0")
    await submit(event_log, "j-before")
    poison = [await publish_raw(event_log, JUNK), await publish_raw(event_log, V2)]
    await submit(event_log, "j-after")
    last_poison = await publish_raw(event_log, JUNK)  # poison as the log's last message

    first = Projector(event_log, dsn, batch_size=2)  # small batches: poison lands at every position
    try:
        assert await first.catch_up() == last_poison
    finally:
        await first.close()

    state = await fresh_fold(event_log)
    assert await fetch_jobs(conn) == [job_row(state.jobs[j]) for j in sorted(state.jobs)]
    assert await fetch_archive_seqs(conn) == list(range(1, last_poison + 1))
    rows = await conn.fetch(
        f"SELECT seq, type, data FROM {SCHEMA}.events WHERE type = 'quarantined' ORDER BY seq"
    )
    assert [r["seq"] for r in rows] == [*poison, last_poison]
    assert rows[1]["data"]["reason"] == "newer-version" and rows[1]["data"]["event_type"] == "JobSubmitted.v2"

    # A restart synchronises over the poison from the stored position, then follows new events.
    await submit(event_log, "j-later")
    second = Projector(event_log, dsn, batch_size=500)
    stop = asyncio.Event()
    task = asyncio.create_task(second.run(stop))
    try:
        target = await event_log.last_seq()
        deadline = time.monotonic() + 10
        while await conn.fetchval(f"SELECT seq FROM {SCHEMA}.projection_position") < target:
            assert time.monotonic() < deadline and not task.done(), "the projector stopped at the poison"
            await asyncio.sleep(0.05)
        assert second.model.state.hash() == (await fresh_fold(event_log)).hash()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await second.close()
    assert {r[0] for r in await fetch_jobs(conn)} == {"j-before", "j-after", "j-later"}


# --- input limits over HTTP: a problem naming the field, never a 500, nothing appended ------------------

LIMITS: list[tuple[str, bytes, int, str]] = [
    ("3,000 levels of nesting", b"[" * 3000 + b"]" * 3000, 400, "body"),
    (
        "nesting inside a spec",
        json.dumps({**SPEC, "env": {"A": "x"}})[:-1].encode() + b', "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        400,
        "body",
    ),
    ("time_limit_s 2^63", json.dumps({**SPEC, "time_limit_s": 2**63}).encode(), 422, "time_limit_s"),
    ("gpus 2^63", json.dumps({**SPEC, "gpus": 2**63}).encode(), 422, "gpus"),
    ("a 200,000-element command", json.dumps({**SPEC, "command": ["x"] * 200_000}).encode(), 422, "command"),
    ("a 900 KB env value", json.dumps({**SPEC, "env": {"BIG": "x" * 900_000}}).encode(), 422, "env"),
]


@pytest.mark.parametrize(("case", "raw", "status", "field"), LIMITS, ids=[c[0] for c in LIMITS])
async def test_bad_input_is_a_problem_naming_the_field(
    client: Client, event_log: EventLog, case: str, raw: bytes, status: int, field: str
) -> None:
    before = await event_log.last_seq()
    resp = await client.post("/v1/jobs", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/problem+json"
    problem = await resp.json()
    assert problem["field"] == field and problem["invalid_params"][0]["name"] == field
    assert await event_log.last_seq() == before
