"""The training client in real processes: kill -9 mid-save, SIGTERM, kill-and-resume of the example."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rallypoint.ckpt import MANIFEST, Checkpointer, list_steps, step_dir, verify_checkpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"

# A rank that commits step 10, then starts step 20 and is killed inside it (where: argv[2]).
CHILD = """
import sys, time
import numpy as np
from rallypoint.ckpt import Checkpointer, numpy_state

root, where = sys.argv[1], sys.argv[2]
ckpt = Checkpointer(root, rank=0, world_size=2 if where == "manifest" else 1, attempt=1)
if where == "write":
    ckpt.save(10, {"w": np.zeros(1 << 20)}).result()
    def stuck(handle, state):
        handle.write(b"PK half a zip archive")
        handle.flush()
        print("writing", flush=True)
        time.sleep(60)
    numpy_state.write_state = stuck
ckpt.save(20, {"w": np.ones(1 << 20)})
print("saving", flush=True)
time.sleep(60)
"""


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def kill_child_at(root: Path, where: str, ready: Callable[[subprocess.Popen[str]], bool]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: ready(child))
    except AssertionError:
        # What the child said: a full make test once timed out here after the child's whole minute, with
        # nothing to tell why
        child.kill()
        _, said = child.communicate(timeout=10)
        raise AssertionError(
            f"the child never reached {where!r}; its stderr ends: {said[-3000:]!r}"
        ) from None
    finally:
        child.kill()  # SIGKILL: no cleanup of any kind
        child.wait(10)


def test_a_save_killed_during_the_shard_write_is_never_loaded(tmp_path: Path) -> None:
    kill_child_at(
        # two threads print (the writer "writing", the main thread "saving"): any line holding it will do
        tmp_path,
        "write",
        lambda child: child.stdout is not None and "writing" in child.stdout.readline(),
    )
    folder = step_dir(tmp_path, 20)
    (left,) = folder.iterdir()  # the half-written temporary file, under a name no reader looks at
    assert left.name.startswith(".rank-00000.npz.") and left.name.endswith(".tmp")
    assert not (folder / "rank-00000.npz").exists() and not (folder / MANIFEST).exists()
    assert list_steps(tmp_path) == [10] and not verify_checkpoint(folder).ok
    loaded = Checkpointer(tmp_path).load_latest()
    assert loaded is not None and loaded.step == 10 and not loaded.state["w"].any()


def test_a_committer_killed_before_the_manifest_leaves_no_step(tmp_path: Path) -> None:
    ranks = [Checkpointer(tmp_path, rank=r, world_size=2, attempt=1) for r in (0, 1)]
    for c in ranks:
        c.save(10, {"w": np.zeros(4)})
    for c in ranks:
        c.close()
    # rank 0 writes step 20 and waits for rank 1, which never comes: killed while waiting
    kill_child_at(tmp_path, "manifest", lambda _: (step_dir(tmp_path, 20) / "rank-00000.done").exists())
    assert list_steps(tmp_path) == [10] and not (step_dir(tmp_path, 20) / MANIFEST).exists()
    loaded = Checkpointer(tmp_path, rank=1, world_size=2).load_latest()
    assert loaded is not None and loaded.step == 10


def rank_env(root: Path, rank: int, world: int, attempt: int, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ, RANK=str(rank), WORLD_SIZE=str(world), RALLY_JOB_ID="job", RALLY_ATTEMPT=str(attempt)
    )
    return env | {"RALLY_CHECKPOINT_DIR": str(root)} | extra


def start_ranks(root: Path, world: int, attempt: int, *args: str) -> list[subprocess.Popen[str]]:
    command = [sys.executable, str(EXAMPLE), *args]
    return [
        subprocess.Popen(command, env=rank_env(root, r, world, attempt), stdout=subprocess.PIPE, text=True)
        for r in range(world)
    ]


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), outputs
    return outputs


def digests(root: Path, world: int) -> list[str]:
    return [(root / f"final-rank-{r}.sha256").read_text() for r in range(world)]


def test_kill_and_resume_of_the_numpy_example_ends_bit_for_bit_equal(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    finish(start_ranks(straight, 2, 1, "--steps", "40", "--step-time", "0", "--ckpt-every", "5"))

    procs = start_ranks(interrupted, 2, 1, "--steps", "40", "--step-time", "0.05", "--ckpt-every", "5")
    wait_until(lambda: any(step >= 10 for step in list_steps(interrupted)))
    for p in procs:
        p.kill()
        p.wait(10)
    assert not list((interrupted).glob("final-rank-*")), "killed before the end"

    outputs = finish(start_ranks(interrupted, 2, 2, "--steps", "40", "--step-time", "0", "--ckpt-every", "5"))
    assert all("resumed from step" in out for out in outputs), outputs
    assert digests(interrupted, 2) == digests(straight, 2)


def test_sigterm_saves_commits_and_exits_0(tmp_path: Path) -> None:
    root, report = tmp_path / "ckpt", tmp_path / "report.jsonl"
    env = rank_env(root, 0, 1, 1, RALLY_REPORT_FILE=str(report))
    args = ["--steps", "100000", "--step-time", "0.05", "--ckpt-every", "100000"]
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), *args], env=env, stdout=subprocess.PIPE, text=True)
    wait_until(lambda: report.exists() and report.stat().st_size > 0)  # the loop is running
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    (stopped,) = list_steps(root)
    assert f"stopped at step {stopped}" in out and verify_checkpoint(step_dir(root, stopped)).ok
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["step"] for line in lines if line["kind"] == "checkpoint"] == [stopped]

    # and the run goes on from there to the same end as a run never stopped
    finish(start_ranks(root, 1, 2, "--steps", str(stopped + 3), "--step-time", "0"))
    finish(start_ranks(tmp_path / "straight", 1, 1, "--steps", str(stopped + 3), "--step-time", "0"))
    assert digests(root, 1) == digests(tmp_path / "straight", 1)


def test_importing_the_client_loads_no_third_party_module() -> None:
    probe = (
        "import sys; from rallypoint.ckpt import Checkpointer, verify_checkpoint; "
        "print(sorted({'numpy', 'torch', 'msgspec', 'nats'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
