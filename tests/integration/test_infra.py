"""The dev servers start, answer, and leave nothing behind when stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import nats
import pytest

from rallypoint.infra import NatsServer, PostgresServer, free_port, port_open
from rallypoint.infra.postgres import APP_ROLE, SUPERUSER
from rallypoint.infra.tempdirs import owned_tempdir


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


@pytest.fixture
def no_client_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No other password source for libpq or asyncpg, so a connection without one really has none."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short, under /tmp: a socket's path holds ~107 bytes, and postgres (another user under root) enters it.
    path = Path(tempfile.mkdtemp(prefix="rally-pgsock-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.usefixtures("no_client_password")
async def test_postgres_refuses_a_connection_without_the_generated_password(socket_dir: Path) -> None:
    """No trust anywhere (issue 30): over TCP and the Unix socket, the superuser and the read models' role
    need the generated password; the DSN carries it, the 0600 credentials file holds both."""
    server = await PostgresServer(unix_socket_dir=socket_dir).astart()
    try:
        rules = [line.split() for line in (server.pgdata / "pg_hba.conf").read_text().splitlines()]
        methods = {rule[-1] for rule in rules if rule and not rule[0].startswith("#")}
        assert methods == {"scram-sha-256"}, methods
        passwords = json.loads(server.credentials_file.read_text())
        assert server.credentials_file.stat().st_mode & 0o777 == 0o600
        for host in ("127.0.0.1", str(socket_dir)):
            for user in (SUPERUSER, APP_ROLE):
                where = {"host": host, "port": server.port, "user": user, "database": server.database}
                for password in (None, "", "wrong"):
                    with pytest.raises(asyncpg.InvalidPasswordError):
                        await asyncpg.connect(**where, password=password)
                conn = await asyncpg.connect(**where, password=passwords[user])
                assert await conn.fetchval("SELECT current_user") == user
                await conn.close()
        conn = await asyncpg.connect(server.dsn)
        privileges = "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        assert tuple(await conn.fetchrow(privileges)) == (False, False, False)
        owner = "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        assert await conn.fetchval(owner) == APP_ROLE
        await conn.close()
    finally:
        await server.astop()


@pytest.mark.usefixtures("no_client_password")
def test_postgres_started_again_over_its_folder_reads_its_passwords_back() -> None:
    folder = owned_tempdir("rally-pg-")  # under /tmp: postgres, another user under root, can enter it
    first = PostgresServer(folder).start()
    again: PostgresServer | None = None
    try:
        first.stop(remove_data=False)
        # Its start connects as the superuser (the role and database exist): the password was read back.
        again = PostgresServer(folder, port=first.port).start()
        assert again.dsn == first.dsn and again.dsn_for("postgres") == first.dsn_for("postgres")
    finally:
        if again is not None:
            again.stop(remove_data=False)
        first.stop(remove_data=True)


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
