"""Temporary folders that do not outlive their owner for long: ``<prefix><pid>-<random>``.

A process that removes its folder on the way out cannot when it is SIGKILLed (a test timeout, the OOM
killer, ``kill -9`` on `rally up`). The folder's name carries its owner's pid, so the next process that
makes one with the same prefix removes those whose owner is gone. Folders of live owners, and folders
named without a pid (older versions), are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def sweep_orphans(prefix: str) -> list[Path]:
    """Remove ``<prefix><pid>-*`` folders in the temp folder whose pid no longer runs; what it removed."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+$")
    removed: list[Path] = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        match = pattern.match(path.name)
        if match is None or not path.is_dir() or _alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def owned_tempdir(prefix: str) -> Path:
    """A new temporary folder named for this process, after removing those of dead owners."""
    sweep_orphans(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
