"""A gang SIGTERMed a moment apart stops at one step: every rank saves it, it commits, nobody loses work.

Real rank processes of examples/train_numpy.py on one real folder; the in-process tests pin down the
agreement's rules (a rank that never got the signal, a dead rank, a previous attempt's stop files).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_ckpt_processes import EXAMPLE, rank_env, wait_until  # tests/unit is on the path
from test_ckpt_torch import free_port

from rallypoint.ckpt import MANIFEST, Checkpointer, list_steps, step_dir, verify_checkpoint
from rallypoint.ckpt.stop import STOP_DIR

WORLD = 4
#: The preemption service's default grace (--preemption-grace): a stop must end well inside it.
GRACE_S = 30.0


def start_rank(root: Path, rank: int, report: Path) -> subprocess.Popen[str]:
    args = ["--steps", "100000", "--step-time", "0.05", "--ckpt-every", "100000"]
    env = rank_env(root, rank, WORLD, 1, RALLY_REPORT_FILE=str(report))
    return subprocess.Popen([sys.executable, str(EXAMPLE), *args], env=env, stdout=subprocess.PIPE, text=True)


def running(report: Path) -> bool:
    return report.exists() and report.stat().st_size > 0


def stopped_step(output: str) -> int:
    match = re.search(r"stopped at step (\d+)", output)
    assert match, output
    return int(match.group(1))


def test_four_ranks_signalled_apart_save_one_step_and_lose_no_work(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    reports = [tmp_path / f"report-{rank}.jsonl" for rank in range(WORLD)]
    ranks = [start_rank(root, rank, reports[rank]) for rank in range(WORLD - 1)]
    try:
        wait_until(lambda: running(reports[0]))
        ranks.append(start_rank(root, WORLD - 1, reports[WORLD - 1]))  # starts behind the others
        wait_until(lambda: all(running(report) for report in reports))

        first_signal = time.monotonic()
        ranks[2].send_signal(signal.SIGTERM)
        ranks[0].send_signal(signal.SIGTERM)  # a moment later: mid-step, or a step boundary later
        ranks[2].wait(GRACE_S)  # the first one signalled has saved its part and exited
        ranks[1].send_signal(signal.SIGTERM)  # long after the others (a no-op if it has exited)
        # Rank 3 gets no signal at all.
        outputs = [rank.communicate(timeout=GRACE_S)[0] for rank in ranks]
        all_exited_s = time.monotonic() - first_signal
    finally:
        for rank in ranks:
            rank.kill()  # no-op for the ranks that exited; stops the rest if an assertion failed
            rank.wait(10)

    assert [rank.returncode for rank in ranks] == [0] * WORLD, outputs
    steps = [stopped_step(output) for output in outputs]
    assert len(set(steps)) == 1, f"ranks stopped at different steps: {steps}"
    (stop,) = set(steps)
    assert list_steps(root) == [stop], "exactly one checkpoint, the stop step"
    folder = step_dir(root, stop)
    assert verify_checkpoint(folder).ok
    assert json.loads((folder / MANIFEST).read_text())["world_size"] == WORLD
    # Lost work: the steps any rank trained beyond the committed one. Each rank's shard holds the step it
    # trained to, and it trained no further (it printed that step as it stopped).
    trained = [int(Checkpointer(root, rank=r, world_size=WORLD).load(stop)["step"]) for r in range(WORLD)]
    assert max(trained) - stop == 0
    assert all_exited_s < GRACE_S / 3, f"all ranks exited {all_exited_s:.1f}s after the first SIGTERM"
    assert not (root / STOP_DIR / "attempt-1").exists(), "the committed stop clears its stop files"
    print(f"stop step {stop}; all {WORLD} ranks exited 0 {all_exited_s:.2f}s after the first SIGTERM")


def test_a_rank_that_has_stopped_exits_0_whatever_sigterms_still_arrive(tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    env = rank_env(tmp_path / "ckpt", 0, 1, 1, RALLY_REPORT_FILE=str(report))
    args = ["--steps", "100000", "--step-time", "0.01", "--ckpt-every", "100000"]
    rank = subprocess.Popen([sys.executable, str(EXAMPLE), *args], env=env, stdout=subprocess.PIPE, text=True)
    wait_until(lambda: running(report))
    # One SIGTERM after another until it is gone: some land while the interpreter exits.
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        rank.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            rank.wait(0.002)
            break
    output = rank.communicate(timeout=10)[0]
    assert rank.returncode == 0, output
    assert "stopped at step" in output


def gang(root: Path, *, attempt: int = 1, timeout_s: float = 20.0) -> list[Checkpointer]:
    return [
        Checkpointer(root, rank=r, world_size=2, attempt=attempt, stop_timeout_s=timeout_s) for r in (0, 1)
    ]


def test_a_rank_without_the_signal_trains_on_to_the_stop_step_of_a_rank_ahead(tmp_path: Path) -> None:
    ahead, behind = gang(tmp_path)
    ahead.request_stop()
    answer: list[bool] = []
    waiting = threading.Thread(target=lambda: answer.append(ahead.should_stop_at(10)))
    waiting.start()
    wait_until(lambda: (tmp_path / STOP_DIR / "attempt-1" / "rank-00000.json").exists())

    assert [behind.should_stop_at(step) for step in (8, 9, 10)] == [False, False, True]
    assert behind.should_stop
    waiting.join(10)
    assert answer == [True]


def test_a_dead_rank_is_waited_for_only_until_the_stop_timeout(tmp_path: Path) -> None:
    alive, _dead = gang(tmp_path, timeout_s=0.3)
    began = time.monotonic()
    alive.request_stop()
    assert alive.should_stop_at(7)  # stops at its own step: the dead rank never publishes
    assert 0.3 <= time.monotonic() - began < 5.0


def test_a_new_attempt_ignores_the_stop_files_of_the_one_before(tmp_path: Path) -> None:
    for rank in gang(tmp_path, attempt=1):
        rank.request_stop()
        threading.Thread(target=rank.should_stop_at, args=(5,), daemon=True).start()
    wait_until(lambda: len(list((tmp_path / STOP_DIR / "attempt-1").glob("rank-*.json"))) == 2)

    relaunched = gang(tmp_path, attempt=2)
    assert [rank.should_stop_at(6) for rank in relaunched] == [False, False]
    assert not any(rank.should_stop for rank in relaunched)


# Two ranks in lockstep on torch.distributed (gloo), each step an all-reduce as DDP's backward does, with
# the plain Checkpointer: should_stop_at all-reduces the stop instead of waiting for files.
LOCKSTEP = """
import sys, time
import numpy as np
import torch, torch.distributed as dist
from rallypoint.ckpt import Checkpointer
dist.init_process_group("gloo")
ckpt = Checkpointer.from_env()
ckpt.install_sigterm_handler()
for step in range(100000):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.005)
    if step == 20:
        print("running", flush=True)
    if ckpt.should_stop_at(step + 1):
        ckpt.save(step + 1, {"w": np.full(4, step + 1.0)})
        ckpt.close()
        print(f"stopped at step {step + 1}", flush=True)
        break
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not importable")
def test_ranks_on_torch_distributed_agree_by_an_all_reduce(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", LOCKSTEP],
            env=rank_env(tmp_path, rank, 2, 1, **env),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        assert ranks[1].stdout is not None and ranks[1].stdout.readline() == "running\n"
        ranks[1].send_signal(signal.SIGTERM)  # rank 0 never gets one
        outputs = [rank.communicate(timeout=60)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait(10)
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    steps = {stopped_step(output) for output in outputs}
    assert len(steps) == 1 and list_steps(tmp_path) == list(steps), outputs
    assert not (tmp_path / STOP_DIR).exists(), "agreed without stop files"
