"""The DCP adapter with a real 2-rank DDP job on gloo (examples/train_ddp.py): kill -9 and resume ends
with the same parameters as an uninterrupted run; SIGTERM on one rank stops both after a checkpoint."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rallypoint.ckpt import MANIFEST, list_steps, step_dir, verify_checkpoint

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not importable (pip install -e '.[dev]' installs torch==2.13.0, the CPU build)",
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
WORLD = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(root: Path, attempt: int, *args: str) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD))
    env |= {"RALLY_CHECKPOINT_DIR": str(root), "RALLY_JOB_ID": "ddp", "RALLY_ATTEMPT": str(attempt)}
    command = [sys.executable, str(EXAMPLE), *args]
    return [
        subprocess.Popen(command, env=env | rank_env(root, r), stdout=subprocess.PIPE, text=True)
        for r in range(WORLD)
    ]


def rank_env(root: Path, rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "RALLY_REPORT_FILE": str(report_file(root, rank))}


def report_file(root: Path, rank: int) -> Path:
    return root.parent / f"{root.name}-rank-{rank}.report"


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, outputs
    return outputs


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def digests(root: Path) -> list[str]:
    return [(root / f"final-rank-{r}.sha256").read_text() for r in range(WORLD)]


def test_ddp_kill_and_resume_ends_with_the_same_parameters(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    args = ["--steps", "24", "--ckpt-every", "4"]
    finish(start(straight, 1, *args))

    procs = start(interrupted, 1, *args, "--step-time", "0.1")
    wait_until(lambda: any(step >= 8 for step in list_steps(interrupted)))
    for p in procs:
        p.kill()
        p.wait(10)
    assert not list(interrupted.glob("final-rank-*")), "killed before the end"
    latest = list_steps(interrupted)[-1]
    assert verify_checkpoint(step_dir(interrupted, latest)).ok
    manifest = (step_dir(interrupted, latest) / MANIFEST).read_text()
    assert ".metadata" in manifest and "__1_0.distcp" in manifest  # DCP's files, every rank's

    outputs = finish(start(interrupted, 2, *args))
    assert all("resumed from step" in out for out in outputs), outputs
    assert digests(interrupted) == digests(straight) and len(set(digests(straight))) == 1


def test_sigterm_on_one_rank_stops_both_after_a_checkpoint(tmp_path: Path) -> None:
    procs = start(tmp_path, 1, "--steps", "100000", "--ckpt-every", "100000", "--step-time", "0.05")
    wait_until(lambda: report_file(tmp_path, 1).exists())  # rank 1's loop runs: its handler is installed
    procs[1].send_signal(signal.SIGTERM)
    outputs = finish(procs)
    (stopped,) = list_steps(tmp_path)
    assert all(f"stopped at step {stopped}" in out for out in outputs), outputs
    assert verify_checkpoint(step_dir(tmp_path, stopped)).ok
