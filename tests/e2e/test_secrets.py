"""End to end: a job's secret reaches its rank and nothing else (issue 30, item 4).

A real local cluster (one agent, one GPU; every service its own process and its own NATS user under the
production permission matrix) runs one job submitted with ``secrets``. Its rank writes the sha256 of the
variable it got, which must be the value's; the value itself must then be absent from every message of
the stream (raw bytes, headers included), an export of the log, every table of the projector's
PostgreSQL, every service's /metrics, every service log and every file of the cluster's work dir (the
agents' task files, the ranks' logs) but the NATS server's own storage; once the job has ended, its key
is purged from the ``rally-secrets`` bucket. Identities other than the API and the job controller cannot
read the bucket at all. Before, a rank's token could only travel in ``env``: in the log, for every reader.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import cluster_jobs
import nats.errors
import pytest

from rallypoint.cli.replay import export_history, read_history
from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.eventlog.secretstore import SecretStore
from rallypoint.localcluster import LocalCluster
from rallypoint.security.permissions import STREAM, agent_user

pytestmark = pytest.mark.slow

TERMINAL = {"completed", "failed", "cancelled", "rejected"}
#: the rank's program: the digest of the secret it was given, written where the test reads it
DIGEST = (
    "import hashlib, os; "
    "digest = hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest(); "
    "open(os.environ['DIGEST_FILE'], 'w').write(digest)"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("secrets"), nodes=1, gpus_per_node=1, racks=1)
    try:
        local.start(timeout=300.0)  # a generous deadline: on a loaded machine services start slowly
        yield local
    finally:
        local.stop()


def wait_state(cluster: LocalCluster, job_id: str, timeout: float = 90.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    view: dict[str, object] = {}
    while time.monotonic() < deadline:
        view = cluster_jobs.job(cluster, job_id)
        if view.get("state") in TERMINAL:
            return view
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never ended; last seen {view}")


async def raw_stream(url: str) -> bytes:
    """Every message of the log as stored: headers and data, undecoded."""
    log = await EventLog.connect(url, name="e2e-secrets-raw", create=False)
    try:
        chunks = []
        for seq in range(1, await log.last_seq() + 1):
            msg = await log.js.get_msg(log.stream, seq)
            chunks.append(repr(msg.headers).encode() + (msg.data or b""))
        return b"\n".join(chunks)
    finally:
        await log.close()


async def secrets_of(url: str, job_id: str) -> dict[str, str] | None:
    nc = await connect_nats(url, name="e2e-secrets-admin")
    try:
        return await (await SecretStore.open(nc.jetstream(), create=False)).read(job_id)
    finally:
        await nc.close()


async def until_purged(url: str, job_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while await secrets_of(url, job_id) is not None:
        assert time.monotonic() < deadline, f"{job_id}'s secrets still stored {timeout:.0f} s after its end"
        await asyncio.sleep(0.2)


async def postgres_text(dsn: str, seq: int) -> str:
    """Every row of every table of the read model, as text, once the projector has applied ``seq``."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 30
        while (await conn.fetchval("SELECT max(seq) FROM rally.projection_position") or 0) < seq:
            assert time.monotonic() < deadline, "the projector never reached the end of the log"
            await asyncio.sleep(0.2)
        tables = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'"
        )
        assert tables
        rows = []
        for table in tables:
            name = f'"{table["table_schema"]}"."{table["table_name"]}"'
            rows += [str(r[0]) for r in await conn.fetch(f"SELECT t::text FROM {name} t")]
        return "\n".join(rows)
    finally:
        await conn.close()


async def reads_secrets(url: str) -> bool:
    """Whether this identity can read the secrets bucket; it must be able to read the log (a control)."""
    nc = await connect_nats(url, name="e2e-secrets-intruder")
    try:
        js = nc.jetstream(timeout=2.0)
        await js.stream_info(STREAM)  # allowed to every service and agent: the connection works
        try:
            await (await SecretStore.open(js, create=False)).read("j-any")
        except (nats.errors.Error, TimeoutError):
            return False
        return True
    finally:
        await nc.close()


def files_under(root: Path, skip: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file() and skip not in path.parents:
            yield path


def test_a_secret_reaches_its_rank_and_nothing_else(cluster: LocalCluster, tmp_path: Path) -> None:
    value = f"wandb-{uuid.uuid4().hex}"
    probes = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    digest_file = probes / "digest"
    job_id = cluster_jobs.submit(
        cluster,
        "secret-user",
        [sys.executable, "-c", DIGEST],
        env={"DIGEST_FILE": str(digest_file)},
        secrets={"WANDB_API_KEY": value},
    )
    view = wait_state(cluster, job_id)
    assert view["state"] == "completed", view
    assert digest_file.read_text() == hashlib.sha256(value.encode()).hexdigest()  # the rank got it
    assert view["spec"]["secret_names"] == ["WANDB_API_KEY"]  # type: ignore[index]
    asyncio.run(until_purged(cluster.nats_url, job_id))

    secret = value.encode()
    assert secret not in asyncio.run(raw_stream(cluster.nats_url))
    history = asyncio.run(read_history(cluster.nats_url, None))
    export = tmp_path / "export.jsonl"
    export_history(history, str(export))
    assert export.stat().st_size > 0 and secret not in export.read_bytes()
    assert value not in asyncio.run(postgres_text(cluster.postgres_dsn, history[-1][0]))
    for service, url in cluster.metrics_urls().items():
        with urllib.request.urlopen(url, timeout=5) as response:
            assert secret not in response.read(), service
    scanned = [p for p in files_under(cluster.workdir, cluster.workdir / "nats") if secret in p.read_bytes()]
    assert scanned == []
    assert list((cluster.workdir / "logs").glob("*.log")), "no service log was scanned"


def test_only_the_api_and_the_job_controller_reach_the_bucket(cluster: LocalCluster) -> None:
    assert cluster.nats is not None and cluster.credentials is not None
    passwords = cluster.credentials.passwords
    intruders = [agent_user(cluster.agent_nodes()[0]), "projector", "scheduler", "inventory", "checkpoint"]
    for user in intruders:
        assert not asyncio.run(reads_secrets(cluster.nats.url_for(user, passwords[user]))), user
    for user in ("api", "job-controller"):
        assert asyncio.run(reads_secrets(cluster.nats.url_for(user, passwords[user]))), user


async def purge(url: str, job_id: str) -> None:
    nc = await connect_nats(url, name="e2e-secrets-admin")
    try:
        assert await (await SecretStore.open(nc.jetstream(), create=False)).forget(job_id)
    finally:
        await nc.close()


def test_a_job_whose_secrets_are_gone_fails_saying_so_instead_of_running(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    probes = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    go, digest_file = probes / "go", probes / "digest"
    wait_for_go = "import os, time\nwhile not os.path.exists(os.environ['GO']): time.sleep(0.1)"
    blocker = cluster_jobs.submit(
        cluster, "holds-the-gpu", [sys.executable, "-c", wait_for_go], env={"GO": str(go)}
    )
    job_id = cluster_jobs.submit(
        cluster,
        "lost-secret",
        [sys.executable, "-c", DIGEST],
        env={"DIGEST_FILE": str(digest_file)},
        secrets={"WANDB_API_KEY": "never-delivered"},
    )
    asyncio.run(purge(cluster.nats_url, job_id))  # the one GPU is the blocker's: the job has not launched
    go.touch()
    assert wait_state(cluster, blocker)["state"] == "completed"
    view = wait_state(cluster, job_id)
    assert view["state"] == "failed", view
    assert "WANDB_API_KEY" in str(view["reason"]) and "secrets store" in str(view["reason"]), view
    assert not digest_file.exists()  # no rank ran without its secret
