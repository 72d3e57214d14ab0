"""Step folders a save left without a manifest: the committer removes them once a later step commits and
when it resumes, never a save still committing, a committed step or a newer folder; `rally checkpoints`
lists what is left as INCOMPLETE. Real Checkpointers (ranks as threads) on a real folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rallypoint.ckpt import Checkpointer, list_steps, step_dir, verify_checkpoint
from rallypoint.ckpt.abandoned import IncompleteStep, incomplete_steps, remove_abandoned
from rallypoint.cli.checkpoint_cmds import format_checkpoints, incomplete_on_disk


def gang(root: Path, world: int = 2, attempt: int = 1, **kwargs: Any) -> list[Checkpointer]:
    return [
        Checkpointer(root, rank=r, world_size=world, job_id="job", attempt=attempt, **kwargs)
        for r in range(world)
    ]


def save(ranks: list[Checkpointer], step: int) -> None:
    for ckpt in ranks:
        ckpt.save(step, {"w": np.full(8, step + ckpt.rank, dtype=np.float64), "step": step})


def commit(root: Path, step: int, attempt: int = 1) -> None:
    """Every rank saves ``step``; it commits."""
    ranks = gang(root, attempt=attempt)
    save(ranks, step)
    for ckpt in ranks:
        ckpt.close()


def one_shard(root: Path, step: int, rank: int = 1, attempt: int = 1) -> None:
    """What a stale rank (or a gang killed mid-save) leaves: its own part of ``step``, durable, alone."""
    (lonely,) = gang(root, attempt=attempt)[rank:][:1]
    save([lonely], step)
    lonely.close()


def folders(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir())


def test_a_commit_removes_the_older_folders_that_never_committed(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    commit(root, 2)
    one_shard(root, 4)
    killed = step_dir(root, 6)
    killed.mkdir()
    (killed / ".rank-00000.npz.4242.tmp").write_bytes(b"half a shard")  # cut short before its rename
    one_shard(root, 12)  # newer than any commit: a save that may still complete
    assert [s.step for s in incomplete_steps(root)] == [4, 6, 12]

    commit(root, 8, attempt=2)

    assert not step_dir(root, 4).exists() and not killed.exists()
    assert list_steps(root) == [2, 8] and all(verify_checkpoint(step_dir(root, s)).ok for s in (2, 8))
    assert [s.step for s in incomplete_steps(root)] == [12], "not superseded: left alone"


def test_a_save_still_committing_is_not_removed_by_a_later_commit(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    zero, one = gang(root, commit_timeout_s=1.0)
    waiting = zero.save(10, {"w": np.zeros(2)})
    later = zero.save(20, {"w": np.zeros(2)})
    one.save(20, {"w": np.ones(2)})  # rank 1 never saves step 10: its commit waits for it
    assert later.result(timeout=10) == 20 and not waiting.done()
    assert step_dir(root, 10).is_dir(), "step 10's commit was still waiting when step 20 committed"
    assert waiting.result(timeout=10) is None
    zero.close()
    one.close()
    assert step_dir(root, 10).is_dir(), "no commit after it gave up: nothing superseded it since"

    assert Checkpointer(root, rank=1, world_size=2).load_latest() is not None
    assert step_dir(root, 10).is_dir(), "only the committer removes folders"
    loaded = Checkpointer(root, rank=0, world_size=2).load_latest()
    assert loaded is not None and loaded.step == 20
    assert not step_dir(root, 10).exists(), "a resume removes it: step 20 committed after it"


def test_a_resume_removes_superseded_folders_only(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    commit(root, 4)
    one_shard(root, 2)
    one_shard(root, 6)
    (root / ".stop" / "attempt-1").mkdir(parents=True)
    elsewhere = tmp_path / "not-a-step"
    elsewhere.mkdir()
    os.symlink(elsewhere, step_dir(root, 1))  # a link is never followed into

    assert Checkpointer(root, rank=0, world_size=2, attempt=2).remove_abandoned_steps() == [2]
    assert folders(root) == [".stop", step_dir(root, 1).name, step_dir(root, 4).name, step_dir(root, 6).name]
    assert elsewhere.is_dir()


def test_a_folder_that_cannot_be_removed_is_left_for_the_next_commit(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root removes files from a read-only folder")
    root = tmp_path / "ckpt"
    one_shard(root, 2)
    step_dir(root, 2).chmod(0o500)
    try:
        assert remove_abandoned(root, below=4) == []
    finally:
        step_dir(root, 2).chmod(0o700)
    assert remove_abandoned(root, below=4) == [2]


def test_an_incomplete_folder_says_which_ranks_finished_their_part(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    one_shard(root, 6, rank=1)
    (step_dir(root, 6) / "rank-00003.done").write_text('{"rank": 2}')  # under another rank's name
    (found,) = incomplete_steps(root)
    assert found == IncompleteStep(6, step_dir(root, 6), (1,), found.bytes) and found.bytes > 0
    assert incomplete_steps(tmp_path / "missing") == []


def test_rally_checkpoints_lists_the_folders_left_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    commit(root, 4)
    one_shard(root, 8)
    committed = {"step": 4, "attempt": 1, "path": str(step_dir(root, 4)), "bytes": 10, "shards": 2}
    committed |= {"save_s": 0.1, "committed_at": 1.7e9, "status": "verified", "error": None}

    (incomplete,) = incomplete_on_disk([committed])
    assert incomplete["step"] == 8 and incomplete["ranks_done"] == [1]
    assert incomplete["path"] == str(step_dir(root, 8))
    table = format_checkpoints([committed], 4, [incomplete]).splitlines()
    assert "VERIFIED" in table[1] and "INCOMPLETE" in table[2] and "ranks with a durable part: 1" in table[2]
    assert incomplete_on_disk([{**committed, "path": str(tmp_path / "unreadable" / "step-4")}]) == []
