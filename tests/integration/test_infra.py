"""The dev servers start, answer, and leave nothing behind when stopped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import asyncpg
import nats
import pytest

from rallypoint.infra import NatsServer, PostgresServer, free_port, port_open


def _gone(pid: int) -> bool:
    """True when pid no longer exists or is a zombie waiting for a reaper we do not control."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 1024 < port < 65536
    assert not port_open("127.0.0.1", port)


async def test_nats_starts_serves_jetstream_and_stops(tmp_path: Path) -> None:
    server = await NatsServer(tmp_path / "nats").astart()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        info = await js.account_info()
        assert info.limits is not None
        await nc.close()
    finally:
        pid = server.pid
        await server.astop()
    assert pid is not None and _wait_gone(pid)
    assert not port_open("127.0.0.1", server.port)
    assert (tmp_path / "nats" / "nats-server.log").exists()


async def test_postgres_starts_answers_and_stops() -> None:
    server = await PostgresServer().astart()
    base = server.base_dir
    try:
        conn = await asyncpg.connect(server.dsn)
        assert await conn.fetchval("SELECT current_database()") == "rallypoint"
        assert await conn.fetchval("SELECT 40 + 2") == 42
        # A leaked connection must not hold up the shutdown (fast shutdown, not smart).
    finally:
        pid = server.pid
        await server.astop()
    assert pid is not None and _wait_gone(pid)
    assert not port_open("127.0.0.1", server.port)
    assert not base.exists()
    if os.geteuid() == 0:
        assert server.os_user != "root"


def test_servers_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from rallypoint.infra import NatsServer, PostgresServer
        n = NatsServer().start()
        p = PostgresServer().start()
        print(n.pid, p.pid, n.data_dir, p.base_dir, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        fields = parent.stdout.readline().split()
        nats_pid, pg_pid = int(fields[0]), int(fields[1])
        leftovers = [Path(fields[2]), Path(fields[3])]
        assert not _gone(nats_pid) and not _gone(pg_pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        _check_children_died(nats_pid, pg_pid)
    finally:
        # A SIGKILLed parent cannot remove its temporary data dirs; that is the one thing left behind.
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)


def _check_children_died(nats_pid: int, pg_pid: int) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signal is Linux only")
    assert _wait_gone(nats_pid), "nats-server outlived its parent"
    assert _wait_gone(pg_pid), "postgres outlived its parent"
