"""`rally up` checks its ports before it starts anything (issue 31): a taken one is one line at once,
naming the port, who holds it (another cluster's folder when that is knowable) and the flag to move it,
exit 1, nothing started. A port taken after the check, while the services start, reads the same."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.infra import ManagedProcess
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.portcheck import PortTaken


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _rally_up(folder: Path, port: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "rallypoint.cli.main", "up", "--nodes", "1", "--api-port", str(port)]
    return subprocess.run(
        [*argv, "--data-dir", str(folder / "state")], cwd=folder, capture_output=True, text=True, timeout=60
    )


def test_a_taken_api_port_refuses_at_once_and_starts_nothing(tmp_path: Path, taken_port: int) -> None:
    started = time.monotonic()
    up = _rally_up(tmp_path, taken_port)
    assert up.returncode == 1, up.stdout + up.stderr
    assert time.monotonic() - started < 20, "it refuses before starting any server"
    (line,) = up.stderr.strip().splitlines()
    assert f"port {taken_port} (the API's) is taken by pid " in line, line
    assert "--api-port " in line and "Nothing was started" in line, line
    assert not (tmp_path / "state" / "nats").exists() and not (tmp_path / "state" / "logs").exists()
    assert not (tmp_path / ".rally" / "cluster.json").exists()


def test_the_holder_is_named_by_its_cluster_folder(tmp_path: Path) -> None:
    """Another `rally up` holds the port: its folder's cluster file names it, and so does the refusal."""
    other = tmp_path / "other"
    (other / ".rally").mkdir(parents=True)
    listener = (
        "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", listener], cwd=other, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        cluster_file = {"api_url": f"http://127.0.0.1:{port}", "metrics_urls": {}}
        (other / ".rally" / "cluster.json").write_text(json.dumps(cluster_file))
        mine = tmp_path / "mine"
        mine.mkdir()
        up = _rally_up(mine, port)
    finally:
        holder.kill()
        holder.wait()
    assert up.returncode == 1, up.stderr
    assert f"is taken by the local cluster of {other} (rally up, pid {holder.pid})" in up.stderr, up.stderr


def test_a_port_taken_while_the_services_start_reads_the_same(tmp_path: Path, taken_port: int) -> None:
    """The API lost the race for its port after the check: the refusal names the port, not a log tail."""
    cluster = LocalCluster(tmp_path / "state", nodes=1, with_agents=False, api_port=taken_port)
    log = tmp_path / "api.log"
    bind_error = '{"level": "error", "message": "[Errno 98] address already in use"}\n' * 60
    cluster.processes["api"] = ManagedProcess(
        [sys.executable, "-c", f"import sys; sys.stdout.write({bind_error!r}); sys.exit(1)"], log_path=log
    )
    cluster.processes["api"].popen.wait(30)
    with pytest.raises(PortTaken, match=rf"port {taken_port} \(the API's\) is taken by pid .* --api-port"):
        cluster.wait_ready(timeout=10)
