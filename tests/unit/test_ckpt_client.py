"""The training client in one process: ranks are Checkpointers (threads) sharing a real folder."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rallypoint.bench.ckptbench import bench_blocking
from rallypoint.ckpt import MANIFEST, Checkpointer, list_steps, step_dir, verify_checkpoint
from rallypoint.ckpt.numpy_state import NumpyCodec


def ranks(root: Path, world: int, **kwargs: Any) -> list[Checkpointer]:
    return [
        Checkpointer(root, rank=r, world_size=world, job_id="job", attempt=1, **kwargs) for r in range(world)
    ]


def save_all(root: Path, step: int, world: int = 2) -> None:
    checkpointers = ranks(root, world)
    for c in checkpointers:
        c.save(step, {"w": np.full(64, step + c.rank, dtype=np.float64), "step": step})
    for c in checkpointers:
        c.close()


class GatedCodec(NumpyCodec):
    """Writes only once its gate opens: a slow disk, under the test's control."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write(self, folder: Path, rank: int, state: Any) -> list[str]:
        assert self.gate.wait(10)
        return super().write(folder, rank, state)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "ckpt"


def test_a_state_round_trips_and_is_copied_at_save(root: Path) -> None:
    weights = np.arange(10, dtype=np.float32)
    state = {"w": weights, "blob": b"\x00\xff", "lr": 0.5, "name": "x", "sched": {"k": [1, 2]}, "n": None}
    with Checkpointer(root) as ckpt:
        ckpt.save(3, state)
        weights += 100  # the loop moves on at once; the checkpoint keeps step 3's values
    loaded = Checkpointer(root).load_latest()
    assert loaded is not None and loaded.step == 3
    assert loaded.state["w"].tolist() == list(range(10)) and loaded.state["w"].dtype == np.float32
    assert {k: v for k, v in loaded.state.items() if k != "w"} == {k: v for k, v in state.items() if k != "w"}


def test_reused_copy_buffers_never_mix_two_saves(root: Path) -> None:
    weights = np.zeros(1000)
    with Checkpointer(root, codec=NumpyCodec(max_in_flight=2)) as ckpt:
        for step in range(1, 7):
            weights[:] = step  # changed in place, as a training loop does
            ckpt.save(step, {"w": weights})
    for step in range(1, 7):
        assert set(Checkpointer(root).load(step)["w"].tolist()) == {step}


def test_the_benchmark_returns_its_documented_numbers(tmp_path: Path) -> None:
    result = bench_blocking(size_mb=1, trials=2, directory=tmp_path)
    assert {"async_block_ms_p50", "sync_block_ms_p50", "ratio"} <= set(result)
    assert result["ratio"] == pytest.approx(
        result["async_block_ms_p50"] / result["sync_block_ms_p50"], rel=0.01
    )
    assert list(tmp_path.iterdir()) == []  # it cleans up after itself


@pytest.mark.parametrize("bad", [{"o": object()}, {"o": np.array([object()])}, {1: 2}, {"s": {1, 2}}])
def test_a_state_that_cannot_be_stored_fails_in_the_callers_thread(root: Path, bad: Any) -> None:
    with Checkpointer(root) as ckpt, pytest.raises(TypeError):
        ckpt.save(1, bad)
    assert list_steps(root) == []


def test_the_manifest_commits_only_once_every_rank_is_durable(root: Path) -> None:
    zero, one = ranks(root, 2)
    committed = zero.save(10, {"w": np.zeros(8)}, metadata={"lr": 0.1})
    with pytest.raises(TimeoutError):
        committed.result(timeout=0.3)  # rank 1 has not saved yet
    assert not (step_dir(root, 10) / MANIFEST).exists() and list_steps(root) == []
    one.save(10, {"w": np.ones(8)})
    assert committed.result(timeout=10) == 10
    zero.close()
    one.close()
    manifest = json.loads((step_dir(root, 10) / MANIFEST).read_text())
    assert manifest["format"] == "rallypoint-checkpoint/1" and manifest["metadata"] == {"lr": 0.1}
    assert (manifest["job_id"], manifest["step"], manifest["attempt"], manifest["world_size"]) == (
        "job",
        10,
        1,
        2,
    )
    assert [(s["rank"], s["file"]) for s in manifest["shards"]] == [
        (0, "rank-00000.npz"),
        (1, "rank-00001.npz"),
    ]
    assert verify_checkpoint(step_dir(root, 10)).ok
    assert zero.load(10, rank=1)["w"].tolist() == [1.0] * 8  # a rank may read another's shard


def test_two_saves_in_flight_commit_in_order(root: Path) -> None:
    codec = GatedCodec()
    with Checkpointer(root, codec=codec) as ckpt:
        first = ckpt.save(1, {"w": np.zeros(4)})
        second = ckpt.save(2, {"w": np.ones(4)})  # while the first still writes: returns at once
        assert not first.done() and not second.done() and list_steps(root) == []
        codec.gate.set()
        assert ckpt.wait() == [1, 2]
    assert list_steps(root) == [1, 2] and all(verify_checkpoint(step_dir(root, s)).ok for s in (1, 2))


def test_a_third_save_waits_for_room(root: Path) -> None:
    codec = GatedCodec()
    with Checkpointer(root, codec=codec, max_in_flight=2) as ckpt:
        ckpt.save(1, {})
        ckpt.save(2, {})
        third = threading.Thread(target=ckpt.save, args=(3, {}))
        third.start()
        third.join(0.3)
        assert third.is_alive(), "two saves in flight: the third blocks the loop rather than pile up copies"
        codec.gate.set()
        third.join(10)
    assert list_steps(root) == [1, 2, 3]


def test_step_n_plus_1_commits_while_step_n_waits_for_a_rank(root: Path) -> None:
    zero, one = ranks(root, 2, commit_timeout_s=1.0)
    n = zero.save(10, {"w": np.zeros(2)})
    n_plus_1 = zero.save(20, {"w": np.zeros(2)})
    one.save(20, {"w": np.ones(2)})  # rank 1 never saved step 10
    assert n_plus_1.result(timeout=10) == 20 and not n.done()
    assert n.result(timeout=10) is None  # timed out: step 10 never exists
    zero.close()
    one.close()
    assert list_steps(root) == [20]


def test_a_marker_left_by_an_earlier_attempt_does_not_count(root: Path) -> None:
    (old_one,) = ranks(root, 2)[1:]
    old_one.save(10, {"w": np.ones(2)})
    old_one.close()
    zero = Checkpointer(root, rank=0, world_size=2, job_id="job", attempt=2, commit_timeout_s=0.5)
    assert zero.save(10, {"w": np.zeros(2)}).result(timeout=10) is None
    zero.close()
    assert list_steps(root) == []


def test_a_failed_write_is_raised_by_wait(root: Path) -> None:
    root.mkdir()
    step_dir(root, 5).write_text("a file where the step folder should be")
    ckpt = Checkpointer(root)
    ckpt.save(5, {"w": np.zeros(2)})
    with pytest.raises(OSError):
        ckpt.close()


def damage_shard(root: Path, step: int, how: str) -> None:
    shard = step_dir(root, step) / "rank-00001.npz"
    if how == "missing":
        shard.unlink()
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["missing", "corrupt"])
def test_load_falls_back_to_the_previous_complete_checkpoint(root: Path, how: str) -> None:
    for step in (10, 20, 30):
        save_all(root, step)
    damage_shard(root, 30, how)
    step_dir(root, 40).mkdir()  # and a save killed before its manifest
    for rank in (0, 1):
        loaded = Checkpointer(root, rank=rank, world_size=2).load_latest()
        assert loaded is not None and loaded.step == 20 and loaded.state["w"][0] == 20 + rank


def test_none_when_no_checkpoint_verifies(root: Path) -> None:
    assert Checkpointer(root).load_latest() is None
    save_all(root, 10)
    damage_shard(root, 10, "corrupt")
    assert Checkpointer(root, rank=1, world_size=2).load_latest() is None


def test_the_resume_hint_is_tried_first_and_still_verified(root: Path) -> None:
    for step in (10, 20, 30):
        save_all(root, step)
    hinted = Checkpointer.from_env({"RALLY_CHECKPOINT_DIR": str(root), "RALLY_RESUME_STEP": "20"})
    assert hinted.latest_step() == 20  # the log's word, not the newer step 30 it never recorded
    damage_shard(root, 20, "corrupt")
    assert hinted.latest_step() == 10
    unknown = Checkpointer.from_env({"RALLY_CHECKPOINT_DIR": str(root), "RALLY_RESUME_STEP": "25"})
    assert unknown.latest_step() == 10
    assert Checkpointer(root).latest_step() == 30


def test_the_sigterm_block_sets_the_flag_and_restores_the_handler(root: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    ckpt = Checkpointer(root)
    with ckpt.sigterm():
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the process goes on
        wait_for(lambda: ckpt.should_stop)
    assert signal.getsignal(signal.SIGTERM) == before


def wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_from_env_reads_the_rank_contract(tmp_path: Path) -> None:
    env = {
        "RALLY_CHECKPOINT_DIR": str(tmp_path),
        "RALLY_JOB_ID": "j-1",
        "RALLY_ATTEMPT": "3",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "RALLY_RESUME_STEP": "120",
        "RALLY_REPORT_FILE": str(tmp_path / "r.jsonl"),
    }
    c = Checkpointer.from_env(env)
    assert (c.directory, c.job_id, c.attempt, c.rank, c.world_size) == (tmp_path, "j-1", 3, 2, 4)
    assert (c.resume_step, c.reporter.path) == (120, tmp_path / "r.jsonl")


def test_report_lines_have_the_documented_fields(root: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    zero, one = ranks(root, 2, report_file=report)
    for c in (zero, one):
        c.save(7, {"w": np.zeros(1000)})
    zero.report_step(7, 0.25)
    zero.report_step(8, 0.25)  # within a second of the last: not written
    zero.close()
    one.close()
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    by_kind = {line["kind"]: line for line in lines}
    assert sorted(line["kind"] for line in lines) == ["checkpoint", "step"]  # rank 1 does not commit
    commit, step = by_kind["checkpoint"], by_kind["step"]
    every_line = {"kind", "job_id", "attempt", "rank", "step", "at"}
    assert set(commit) == every_line | {"path", "manifest_sha256", "bytes", "shards", "save_s"}
    folder = step_dir(root, 7)
    assert (commit["job_id"], commit["attempt"], commit["rank"], commit["step"]) == ("job", 1, 0, 7)
    assert commit["path"] == str(folder.resolve()) and commit["shards"] == 2
    assert commit["manifest_sha256"] == hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    assert commit["bytes"] == verify_checkpoint(folder).bytes and 0 < commit["save_s"] < 10
    assert set(step) == every_line | {"step_time_s"}
    assert (step["step"], step["step_time_s"]) == (7, 0.25)
