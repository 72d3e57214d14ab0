"""Temporary folders of processes that died without removing them (SIGKILL) are removed by the next
process that makes one (Issue 18: `make demo` and `rally up` left rally-demo-* and rally-pg-* behind)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from rallypoint.infra.tempdirs import owned_tempdir


def test_folders_of_dead_owners_go_and_the_others_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = tmp_path / f"rally-pg-{dead.pid}-abc"
    (orphan / "pgdata").mkdir(parents=True)
    ours = tmp_path / f"rally-pg-{os.getpid()}-def"
    unnamed = tmp_path / "rally-pg-oldstyle"
    other = tmp_path / f"rally-demo-{dead.pid}-ghi"
    for path in (ours, unnamed, other):
        path.mkdir()
    made = owned_tempdir("rally-pg-")
    assert made.parent == tmp_path and made.name.startswith(f"rally-pg-{os.getpid()}-")
    assert not orphan.exists()
    assert ours.exists() and unnamed.exists() and other.exists()  # alive, unknown, another prefix
