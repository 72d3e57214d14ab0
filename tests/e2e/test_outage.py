"""End to end: a NATS outage is not a massacre, and `rally up` brings its servers back by itself.

- nats-server frozen (SIGSTOP, by the pid the cluster started) for 40 s under running jobs, one of which
  ends during the outage: every service reconnects by itself (each /readyz says so, its fold caught up), no
  node is marked unreachable or lost, no job is interrupted or fails, every job completes; the health
  monitor says why it held its verdicts;
- `rally up`: nats-server and PostgreSQL killed with kill -9 come back on the same ports (new pids, none
  left defunct), and a job submitted afterwards completes.

``RALLY_OUTAGE_S`` lengthens (or shortens) the outage for a manual run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from rallypoint.eventlog import EventLog
from rallypoint.events import Event, JobAttemptFailed, JobFailed, JobInterrupted, NodeHeartbeatLost, NodeLost
from rallypoint.infra import free_port
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call, register_token

pytestmark = pytest.mark.slow

OUTAGE_S = float(os.environ.get("RALLY_OUTAGE_S", "40"))
MASSACRE = (NodeHeartbeatLost, NodeLost, JobInterrupted, JobAttemptFailed, JobFailed)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("outage"), nodes=4, gpus_per_node=8, racks=2) as local:
        yield local


def submit(api: str, name: str, gpus: int, seconds: float, *, retry_s: float = 0.0) -> str:
    """Submit as a CI client does: a 503 (the log or the API's fold not reachable yet) is retried with the
    same Idempotency-Key for up to ``retry_s``."""
    body = {
        "name": name,
        "team": "e2e",
        "gpus": gpus,
        "gpus_per_task": min(gpus, 8),
        "ranks_per_task": 1,
        "command": ["sleep", str(seconds)],
    }
    deadline = time.monotonic() + retry_s
    while True:
        status, answer = call("POST", f"{api}/v1/jobs", body, headers={"Idempotency-Key": name})
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 202, answer
    return str(answer["job_id"])


def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, AssertionError):
            found = check()
            if found:
                return found
        time.sleep(0.25)
    raise AssertionError(f"never: {what}")


def job_state(api: str, job_id: str) -> str:
    status, view = call("GET", f"{api}/v1/jobs/{job_id}")
    return str(view.get("state")) if status == 200 else ""


def events_after(nats_url: str, seq: int) -> list[Event]:
    async def read() -> list[Event]:
        log = await EventLog.connect(nats_url, name="e2e-outage", create=False)
        try:
            return [rec.event async for rec in log.replay(from_seq=seq + 1)]
        finally:
            await log.close()

    return asyncio.run(read())


def log_seq(api: str) -> int:
    return int(call("GET", f"{api}/v1/state")[1]["seq"])


def all_ready(cluster: LocalCluster) -> bool:
    """Every service answers /readyz 200, reaches NATS and has folded up to the stream's end."""
    for name in cluster.health_ports:
        status, body = cluster.health(name)
        log = body.get("log", {}) if isinstance(body, dict) else {}
        if status != 200 or not log.get("connected") or log.get("lag", 0) > 5:
            return False
    return True


def test_a_40_s_nats_stall_under_running_jobs_fails_no_job_and_loses_no_node(cluster: LocalCluster) -> None:
    api = cluster.api_url
    jobs = {
        "gang": submit(api, "gang", 16, OUTAGE_S + 20),
        "small": submit(api, "small", 2, OUTAGE_S + 15),
        "ends-in-outage": submit(api, "ends-in-outage", 1, OUTAGE_S / 3),
    }
    until(lambda: all(job_state(api, j) == "running" for j in jobs.values()), "every job running")
    mark = log_seq(api)
    assert cluster.nats is not None and cluster.nats.pid is not None
    os.kill(cluster.nats.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        time.sleep(OUTAGE_S)
    finally:
        os.kill(cluster.nats.pid, signal.SIGCONT)
    outage = time.monotonic() - stopped
    back = until(lambda: all_ready(cluster) and time.monotonic(), "every service ready again", timeout=60)
    print(
        f"\noutage {outage:.1f} s; every service ready, folds caught up {back - stopped - outage:.1f} s after"
    )

    for name, job_id in jobs.items():
        until(lambda j=job_id: job_state(api, j) in ("completed", "failed"), f"{name} ended", timeout=90)
        assert job_state(api, job_id) == "completed", name
    nodes = call("GET", f"{api}/v1/nodes")[1]["nodes"]
    assert {n["node_id"]: n["status"] for n in nodes} == dict.fromkeys(cluster.node_ids(), "up")
    massacre = [e for e in events_after(cluster.nats_url, mark) if isinstance(e, MASSACRE)]
    assert massacre == []

    monitor_log = (cluster.workdir / "logs" / "health-monitor.log").read_text()
    said = [
        line
        for line in monitor_log.splitlines()
        if "holding every node verdict" in line or "reconnected" in line
    ]
    print("health monitor:\n" + "\n".join(said[:6]))
    assert any("holding every node verdict" in line for line in said)
    assert any("reconnected to NATS" in line for line in said)
    assert cluster.dead_services() == []


# --- `rally up` supervises its servers --------------------------------------------------------------


def pid_of(*needles: str) -> int | None:
    # -ww: whole command lines (ps cuts them to $COLUMNS otherwise, and pytest sets it)
    listing = subprocess.run(
        ["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if all(n in args for n in needles) and "ps -eo" not in args:
            return int(pid)
    return None


def defunct_children(parent: int) -> list[str]:
    listing = subprocess.run(
        ["ps", "-ww", "-o", "pid,stat,args", "--ppid", str(parent)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [line for line in listing.splitlines()[1:] if line.split()[1].startswith("Z")]


def projected_state(dsn: str, job_id: str) -> str | None:
    """The job's state in the projector's read model; None while PostgreSQL does not answer."""

    async def read() -> str | None:
        conn = await asyncpg.connect(dsn, timeout=2)
        try:
            state = await conn.fetchval("SELECT state FROM rally.jobs WHERE job_id = $1", job_id)
        finally:
            await conn.close()
        return None if state is None else str(state)

    try:
        return asyncio.run(read())
    except (OSError, asyncpg.PostgresError):
        return None


def test_rally_up_brings_back_a_killed_nats_server_and_postgres_and_a_job_submitted_after_completes(
    tmp_path: Path,
) -> None:
    port = free_port()
    argv = ["up", "--nodes", "2", "--racks", "1", "--api-port", str(port), "--data-dir", str(tmp_path / "s")]
    up = subprocess.Popen(
        [sys.executable, "-m", "rallypoint.cli.main", *argv],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = ""
    try:
        info_file = tmp_path / ".rally" / "cluster.json"
        until(lambda: info_file.exists() or up.poll() is not None, "rally up is up", timeout=90)
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        info = json.loads(info_file.read_text())
        # `rally up` runs in another process: its admin token is in the tokens file it wrote.
        register_token(
            info["api_url"], json.loads((tmp_path / ".rally" / "tokens.json").read_text())["admin"]
        )
        nats_port = info["nats_url"].rsplit(":", 1)[1]
        pg_port = info["postgres_dsn"].rsplit(":", 1)[1].split("/")[0]
        servers = {
            "nats": ("nats-server", f"--port {nats_port}"),
            "postgres": ("postgres -D", f"-p {pg_port}"),
        }
        for name, needles in servers.items():
            old = pid_of(*needles)
            assert old is not None, name
            os.kill(old, signal.SIGKILL)
            new = until(lambda n=needles, o=old: (pid_of(*n) or o) != o and pid_of(*n), f"{name} back")
            assert new != old and defunct_children(up.pid) == []

        restarted = time.monotonic()
        job_id = submit(info["api_url"], "after-the-restarts", 1, 1, retry_s=30)
        print(f"\nthe API took a submission {time.monotonic() - restarted:.1f} s after both restarts")
        until(lambda: job_state(info["api_url"], job_id) == "completed", "the job completed", timeout=90)
        until(
            lambda: projected_state(info["postgres_dsn"], job_id) == "completed",
            "the projector, on the restarted PostgreSQL, projected it",
        )
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=60)
        output = up.stdout.read() if up.stdout else ""
        print(output)
    assert code == 0, output
    assert "nats-server exited; restarted it" in output and "postgres exited; restarted it" in output
