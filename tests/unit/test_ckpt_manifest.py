"""verify_checkpoint / list_steps on hand-made step folders: every kind of bad data is an ok=False."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rallypoint.ckpt import FORMAT, MANIFEST, list_steps, step_dir, verify_checkpoint

SHARDS = {0: b"rank zero's bytes", 1: b"rank one's bytes, a few more"}


def make_step(root: Path, at: int, changes: dict[str, Any] | None = None) -> Path:
    folder = step_dir(root, at)
    folder.mkdir(parents=True)
    shards = []
    for rank, data in SHARDS.items():
        name = f"rank-{rank:05d}.bin"
        (folder / name).write_bytes(data)
        (folder / f"rank-{rank:05d}.done").write_text("{}")
        digest = hashlib.sha256(data).hexdigest()
        shards.append({"rank": rank, "file": name, "bytes": len(data), "sha256": digest})
    manifest = {"format": FORMAT, "job_id": "j", "step": at, "attempt": 1, "world_size": 2}
    manifest |= {"created_at": 1.0, "shards": shards} | (changes or {})
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_complete_step_verifies(tmp_path: Path) -> None:
    folder = make_step(tmp_path, 40)
    result = verify_checkpoint(str(folder))
    raw = (folder / MANIFEST).read_bytes()
    assert result.ok and result.error == ""
    assert (result.step, result.shards, result.bytes) == (40, 2, sum(map(len, SHARDS.values())))
    assert result.manifest_sha256 == hashlib.sha256(raw).hexdigest()


def folder_for_shard(folder: Path) -> None:
    (folder / "rank-00000.bin").unlink()
    (folder / "rank-00000.bin").mkdir()


def flip(folder: Path) -> None:
    (folder / "rank-00001.bin").write_bytes(b"rank one's bytes, a few MORE")


BROKEN: list[tuple[str, Callable[[Path], Any], str]] = [
    ("no manifest", lambda f: (f / MANIFEST).unlink(), "no manifest"),
    ("not JSON", lambda f: (f / MANIFEST).write_text("{half"), "unreadable manifest"),
    ("a list", lambda f: (f / MANIFEST).write_text("[1]"), "not a JSON object"),
    ("missing shard", lambda f: (f / "rank-00000.bin").unlink(), "rank-00000.bin is missing"),
    ("short shard", lambda f: (f / "rank-00000.bin").write_bytes(b"x"), "has 1 bytes"),
    ("same size, other bytes", flip, "does not match its sha256"),
    ("missing marker", lambda f: (f / "rank-00001.done").unlink(), "rank 1 has no rank-00001.done"),
    (
        "shard is a folder",
        folder_for_shard,
        "missing",
    ),
]


@pytest.mark.parametrize(("case", "damage", "error"), BROKEN, ids=[case for case, _, _ in BROKEN])
def test_damage_is_reported_not_raised(
    tmp_path: Path, case: str, damage: Callable[[Path], Any], error: str
) -> None:
    folder = make_step(tmp_path, 7)
    damage(folder)
    result = verify_checkpoint(folder)
    assert not result.ok and error in result.error, (case, result)


BAD_MANIFESTS: list[tuple[dict[str, Any], str]] = [
    ({"format": "other/2"}, "unknown format"),
    ({"step": "7"}, "must be integers"),
    ({"world_size": 0}, "must be integers"),
    ({"shards": []}, "non-empty list"),
    ({"shards": ["rank-00000.bin"]}, "non-empty list"),
    ({"shards": [{"rank": 0, "file": "../escape", "bytes": 1, "sha256": "0"}]}, "not a plain name"),
    ({"shards": [{"rank": 5, "file": "rank-00000.bin", "bytes": 1, "sha256": "0"}]}, "outside the world"),
    ({"shards": [{"rank": 0, "file": "rank-00000.bin"}]}, "bad shard record"),
    ({"step": 8}, "the folder is step 7"),
]


@pytest.mark.parametrize(("changes", "error"), BAD_MANIFESTS)
def test_bad_manifests_are_reported(tmp_path: Path, changes: dict[str, Any], error: str) -> None:
    result = verify_checkpoint(make_step(tmp_path, 7, changes))
    assert not result.ok and error in result.error, result


def test_list_steps_sees_only_committed_step_folders(tmp_path: Path) -> None:
    assert list_steps(tmp_path / "nowhere") == []
    for step in (30, 10, 20):
        make_step(tmp_path, step)
    step_dir(tmp_path, 40).mkdir()  # a save still in flight (or killed): no manifest
    (tmp_path / "step-junk").mkdir()
    (tmp_path / "step-junk" / MANIFEST).write_text("{}")
    (tmp_path / "final-rank-0.sha256").write_text("x")
    assert list_steps(tmp_path) == [10, 20, 30]
    assert step_dir(tmp_path, 20).name == "step-000000000020"
