"""examples/train_ddp.py (DDP on gloo, checkpoints through DCP) at 2, 4 and 8 ranks: stopped by a SIGTERM
on one rank, resumed, killed with SIGKILL on every rank, resumed again, it ends with the parameters of an
uninterrupted run, bit for bit. Before torch_ddp.reduce_each_parameter, 4 and 8 ranks did not.

Each rank is a process of its own with the torchrun environment contract, started the way a launcher
would start `python examples/train_ddp.py`, but forked from a fork server that has imported torch
already: importing torch costs ~5 s of CPU per process, and the 56 rank processes here would spend
minutes of a 2-core machine on that alone.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import re
import runpy
import socket
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext, ForkServerProcess
from pathlib import Path

import pytest

from rallypoint.ckpt import MANIFEST, list_steps, step_dir, verify_checkpoint
from rallypoint.ckpt.abandoned import incomplete_steps

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not importable (pip install -e '.[dev]' installs torch==2.13.0, the CPU build)",
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
STEPS, CKPT_EVERY = 16, 4
#: What every rank imports, the fork server once for all (DDP's constructor imports torch._dynamo).
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.nn.parallel",
    "rallypoint.ckpt.torch_dcp",
    "rallypoint.ckpt.torch_ddp",
]
#: Seconds a rank may take to start, train and save under a loaded machine's scheduler.
DEADLINE_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_rank(argv: list[str], env: dict[str, str], log: str) -> None:
    """One rank's process: its environment, its output in ``log``, then the example run as a script."""
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)  # the file descriptors, so that torch's and gloo's own messages land there too
    os.dup2(out, 2)
    sys.argv = [str(EXAMPLE), *argv]
    sys.path.insert(0, str(EXAMPLE.parent))  # as `python examples/train_ddp.py` puts it first
    runpy.run_path(str(EXAMPLE), run_name="__main__")  # its sys.exit is the process's exit code


@pytest.fixture(scope="module")
def forkserver() -> ForkServerContext:
    """multiprocessing's fork server: it imports PRELOAD once, and every rank forked from it starts with
    them imported. It ends by itself when this test process does."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, __name__])
    return context


@pytest.fixture
def launch(forkserver: ForkServerContext) -> Iterator[Callable[..., Gang]]:
    """``launch(root, world, attempt, *args)`` starts a gang; any rank still running at the end is killed
    (an assertion failed while it ran)."""
    gangs: list[Gang] = []

    def start(root: Path, world: int, attempt: int, *args: str) -> Gang:
        gangs.append(Gang(forkserver, root, world, attempt, *args))
        return gangs[-1]

    yield start
    for gang in gangs:
        gang.kill()


class Gang:
    """The ranks of one attempt of the example on checkpoint folder ``root``."""

    def __init__(self, context: ForkServerContext, root: Path, world: int, attempt: int, *args: str) -> None:
        self.root, self.world = root, world
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
        env |= {"RALLY_CHECKPOINT_DIR": str(root), "RALLY_JOB_ID": "ddp", "RALLY_ATTEMPT": str(attempt)}
        env |= {"RALLY_RESUME_STEP": ""}
        argv = ["--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY), *args]
        self.logs = [root.parent / f"{root.name}-attempt-{attempt}-rank-{r}.log" for r in range(world)]
        self.ranks: list[ForkServerProcess] = [
            context.Process(target=run_rank, args=(argv, env | self.rank_env(r), str(self.logs[r])))
            for r in range(world)
        ]
        for rank in self.ranks:
            rank.start()

    def rank_env(self, rank: int) -> dict[str, str]:
        return {"RANK": str(rank), "RALLY_REPORT_FILE": str(self.report_file(rank))}

    def report_file(self, rank: int) -> Path:
        return self.root.parent / f"{self.root.name}-rank-{rank}.report"

    def finish(self) -> list[str]:
        """Every rank's output, once every rank has exited 0."""
        for rank in self.ranks:
            rank.join(DEADLINE_S)
        outputs = self.outputs()
        assert [rank.exitcode for rank in self.ranks] == [0] * self.world, outputs
        return outputs

    def kill(self) -> list[str]:
        """SIGKILL to every rank still running; every rank's output."""
        for rank in self.ranks:
            if rank.is_alive():
                rank.kill()
        for rank in self.ranks:
            rank.join(DEADLINE_S)
        return self.outputs()

    def outputs(self) -> list[str]:
        return [log.read_text() if log.exists() else "" for log in self.logs]


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def committed_beyond(root: Path, step: int) -> bool:
    return any(committed > step for committed in list_steps(root))


def digests(root: Path, world: int) -> list[str]:
    return [(root / f"final-rank-{r}.sha256").read_text() for r in range(world)]


def the_step(outputs: list[str], pattern: str) -> int:
    """The one step every rank printed with ``pattern`` (``rank R: resumed from step (\\d+)``...)."""
    steps = {int(m.group(1)) for out in outputs for m in [re.search(pattern, out)] if m}
    assert len(steps) == 1 and all(re.search(pattern, out) for out in outputs), outputs
    return steps.pop()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ddp_stopped_killed_and_resumed_ends_bit_exact(
    launch: Callable[..., Gang], tmp_path: Path, world: int
) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    launch(straight, world, 1).finish()
    expected = digests(straight, world)
    assert len(set(expected)) == 1, "DDP keeps every rank's parameters equal"

    # A SIGTERM on one rank: every rank stops at one step, saves it, the step commits, all exit 0.
    stopped = launch(interrupted, world, 1, "--step-time", "0.05")
    wait_until(lambda: stopped.report_file(1).exists())  # rank 1's loop runs: its handler is installed
    stopped.ranks[1].terminate()
    stop = the_step(stopped.finish(), r"stopped at step (\d+)")
    assert list_steps(interrupted)[-1] == stop and verify_checkpoint(step_dir(interrupted, stop)).ok

    # Resumed there, then SIGKILL of every rank once a later step has committed.
    killed = launch(interrupted, world, 2, "--step-time", "0.25")
    wait_until(lambda: committed_beyond(interrupted, stop))
    assert the_step(killed.kill(), r"resumed from step (\d+)") == stop
    assert not list(interrupted.glob("final-rank-*")), "killed before the end"
    latest = list_steps(interrupted)[-1]
    assert verify_checkpoint(step_dir(interrupted, latest)).ok
    shards = {
        shard["file"]
        for shard in json.loads((step_dir(interrupted, latest) / MANIFEST).read_text())["shards"]
    }
    assert {".metadata", f"__{world - 1}_0.distcp"} <= shards, "DCP's files, every rank's"

    # Resumed again: it ends with the uninterrupted run's parameters, on every rank.
    assert the_step(launch(interrupted, world, 3).finish(), r"resumed from step (\d+)") == latest
    assert digests(interrupted, world) == expected
    assert incomplete_steps(interrupted) == [], "every folder a save left uncommitted was removed"
