"""`rally up` says which user ranks run as, and refuses to run them as its own unless told (issue 30)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rallypoint.infra import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="ranks run as another user only under a root cluster"),
]


def rally_up(folder: Path, *flags: str) -> list[str]:
    argv = [sys.executable, "-m", "rallypoint.cli.main", "up", "--nodes", "1", "--racks", "1"]
    return [*argv, "--api-port", str(free_port()), "--data-dir", str(folder / "state"), *flags]


def without_a_rank_user() -> dict[str, str]:
    # a user this host lacks: the ranks' sandbox cannot be made, as on a host without CAP_SYS_ADMIN
    return {**os.environ, "RALLY_RANK_USER": "no-such-rank-user"}


def test_rally_up_refuses_when_ranks_could_only_run_as_itself(tmp_path: Path) -> None:
    done = subprocess.run(
        rally_up(tmp_path),
        cwd=tmp_path,
        env=without_a_rank_user(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no user 'no-such-rank-user'" in done.stderr and "--allow-root-ranks" in done.stderr
    assert not (tmp_path / ".rally" / "cluster.json").exists()


def test_rally_up_allowed_to_run_ranks_as_itself_says_so_in_its_banner_and_agent_logs(tmp_path: Path) -> None:
    up = subprocess.Popen(
        rally_up(tmp_path, "--allow-root-ranks"),
        cwd=tmp_path,
        env=without_a_rank_user(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    banner: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("Ctrl-C") for line in banner):
            assert time.monotonic() < deadline and up.poll() is None, "".join(banner)
            banner.append(up.stdout.readline())
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    (ranks,) = [line for line in banner if line.strip().startswith("ranks")]
    assert "RUN AS ROOT" in ranks and "--allow-root-ranks" in ranks, ranks
    agent_log = (tmp_path / "state" / "logs" / "agent-node-1.log").read_text()
    assert "WARNING" in agent_log and "RANKS RUN AS ROOT" in agent_log
