"""Quorum (issue 14, item 5): a three-server JetStream cluster on loopback with the R3 ``RALLY`` stream.

- the stream leader is killed (SIGKILL, by pid) under a stream of idempotent submissions through the real
  API: no acknowledged job is lost, none is stored twice;
- two of three servers stop: a submission fails fast, the API answers 503 and nothing is acknowledged
  (503 means "unknown": the survivor may commit the proposal once the quorum is back, so the client's retry
  with the same Idempotency-Key must, and does, give one job);
- the servers come back: every server's copy of the stream ends at the same sequence, and the fold read
  through each server gives the same state hash.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import nats.js.errors
import pytest
from aiohttp import test_utils
from rallypoint_services.api import build_app

from rallypoint.eventlog import EventLog, LogUnavailable, connect_nats, stored
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import JobSpec, JobSubmitted, subjects
from rallypoint.infra import NatsServer, free_port
from rallypoint.state import ClusterState

NAMES = ("q-1", "q-2", "q-3")
SPEC = JobSpec(name="late", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[dict[str, NatsServer]]:
    route_ports = {name: free_port() for name in NAMES}
    routes = tuple(f"nats-route://127.0.0.1:{port}" for port in route_ports.values())
    servers = {
        name: NatsServer(
            tmp_path / name,
            server_name=name,
            monitor_port=free_port(),
            cluster_name="rally-quorum",
            cluster_port=route_ports[name],
            routes=routes,
        )
        for name in NAMES
    }
    try:
        await asyncio.gather(*(s.astart() for s in servers.values()))
        await _set_up_r3(servers)
        yield servers
    finally:
        await asyncio.gather(*(s.astop() for s in servers.values()))


def _urls(servers: dict[str, NatsServer]) -> list[str]:
    return [s.url for s in servers.values()]


async def _set_up_r3(servers: dict[str, NatsServer], timeout: float = 30.0) -> None:
    """The admin setup, retried until the cluster has elected its meta leader."""
    nc = await connect_nats(_urls(servers), name="quorum-setup")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                await setup_log(nc, replicas=3)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)
    finally:
        await nc.close()


def _local_last_seq(server: NatsServer) -> int:
    """The last sequence of this server's own copy of RALLY (its monitoring endpoint, not the leader's)."""
    with urllib.request.urlopen(f"{server.monitor_url}/jsz?streams=true", timeout=2) as response:
        jsz = json.load(response)
    for account in jsz.get("account_details", []):
        for stream in account.get("stream_detail", []):
            if stream["name"] == "RALLY":
                return int(stream["state"]["last_seq"])
    return -1


async def _fold_through(server: NatsServer, timeout: float = 20.0) -> ClusterState:
    """The fold a service connected to ``server`` builds (retried while JetStream is still recovering)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            log = await EventLog.connect(server.url, name=f"quorum-fold-{server.server_name}", create=False)
            try:
                state = ClusterState()
                async for rec in log.replay(quarantine=True):
                    state.apply_stored(rec.seq, stored(rec))
                return state
            finally:
                await log.close()
        except (nats.js.errors.ServiceUnavailableError, LogUnavailable):
            assert time.monotonic() < deadline, f"JetStream on {server.server_name} did not recover"
            await asyncio.sleep(0.25)


async def _submit_until_acked(client: test_utils.TestClient, key: str, deadline: float) -> str:
    """What a CI system does: retry a submission with the same Idempotency-Key until it is accepted."""
    body = {"name": key, "team": "nlp", "gpus": 8, "command": ["true"]}
    while True:
        resp = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
        if resp.status in (200, 201, 202):
            return str((await resp.json())["job_id"])
        assert resp.status == 503, await resp.text()
        assert time.monotonic() < deadline, f"{key} never accepted"
        await asyncio.sleep(0.1)


async def test_leader_loss_minority_and_heal(cluster: dict[str, NatsServer]) -> None:
    log = await EventLog.connect(_urls(cluster), name="quorum-api", create=False)
    try:
        async with test_utils.TestClient(test_utils.TestServer(build_app(log))) as client:
            assert (await client.get("/v1/state")).status == 200

            # 1. Kill the stream leader (by pid) while submissions keep coming.
            info = await log.js.stream_info("RALLY")
            assert info.config.num_replicas == 3 and info.cluster is not None
            leader = cluster[str(info.cluster.leader)]
            deadline = time.monotonic() + 30
            acked = [await _submit_until_acked(client, f"before-{i}", deadline) for i in range(10)]
            submissions = asyncio.gather(
                *(_submit_until_acked(client, f"during-{i}", deadline) for i in range(40))
            )
            await asyncio.sleep(0.05)
            assert leader.pid is not None
            os.kill(leader.pid, signal.SIGKILL)
            acked += await submissions
            acked += [await _submit_until_acked(client, f"after-{i}", deadline) for i in range(10)]
            new_leader = (await log.js.stream_info("RALLY")).cluster
            assert new_leader is not None and new_leader.leader != leader.server_name

            stored_ids = [
                rec.event.job_id
                async for rec in log.replay(quarantine=True)
                if isinstance(getattr(rec, "event", None), JobSubmitted)
            ]
            assert sorted(stored_ids) == sorted(set(stored_ids)), "no job stored twice"
            assert set(acked) <= set(stored_ids), "no acknowledged job lost"
            assert len(set(acked)) == 60

            # 2. Two of three down: a submission fails fast and nothing is acknowledged. A 503 means
            #    "unknown", not "not stored": the survivor may hold the proposal and commit it once the
            #    quorum is back (seen here), which is why a client retries with the same Idempotency-Key.
            leader.stop(remove_data=False)  # reap the killed one; it stays down
            _, down = _split(cluster, leader.server_name)
            await down.astop(remove_data=False)
            started = time.monotonic()
            minority = {"name": "minority", "team": "nlp", "gpus": 8, "command": ["true"]}
            resp = await client.post("/v1/jobs", json=minority, headers={"Idempotency-Key": "minority"})
            assert resp.status == 503 and time.monotonic() - started < 8.0
            late = JobSubmitted(job_id="late", spec=SPEC, submitted_at=1.0)
            with pytest.raises(LogUnavailable):
                await log.append(subjects.job("late"), late, msg_id="late:0:JobSubmitted", source="t")
            assert time.monotonic() - started < 15.0

            # 3. Heal: both come back; every copy converges, every fold agrees, the retry makes one job.
            await asyncio.gather(leader.astart(), down.astart())
            retried = await _submit_until_acked(client, "minority", time.monotonic() + 30)
            await _converged(cluster, log, timeout=30.0)
            folds = {name: await _fold_through(s) for name, s in cluster.items()}
            summary = {n: (f.last_seq, len(f.jobs), f.hash()[:8]) for n, f in folds.items()}
            assert len({f.hash() for f in folds.values()}) == 1, summary
            submitted = [
                rec.event.job_id
                async for rec in log.replay(quarantine=True)
                if isinstance(getattr(rec, "event", None), JobSubmitted)
            ]
            assert submitted.count(retried) == 1 and submitted.count("late") <= 1
    finally:
        await log.close()


def _split(cluster: dict[str, NatsServer], gone: str) -> tuple[NatsServer, NatsServer]:
    rest = [s for name, s in cluster.items() if name != gone]
    return rest[0], rest[1]


async def _converged(cluster: dict[str, NatsServer], log: EventLog, *, timeout: float) -> None:
    """Until every server's own copy ends where the stream leader says the stream ends, twice in a row
    (proposals held through the outage may still be committing)."""
    deadline = time.monotonic() + timeout
    agreed = 0
    while True:
        try:
            seqs = {name: _local_last_seq(s) for name, s in cluster.items()}
            seqs["leader"] = await log.last_seq()
        except (OSError, LogUnavailable):
            seqs = {}
        agreed = agreed + 1 if seqs and len(set(seqs.values())) == 1 and -1 not in seqs.values() else 0
        if agreed >= 2:
            return
        assert time.monotonic() < deadline, f"copies of RALLY did not converge: {seqs}"
        await asyncio.sleep(0.2)
