"""One `rally up` per folder: an exclusive ``flock`` on a lock file, held for the life of the process.

Two clusters on one folder share a JetStream store (nats-server rebuilds the other's stream state) and
overwrite each other's ``.rally/cluster.json`` and tokens; the second one must refuse before it touches
any of them. ``flock`` rather than a pid file: the kernel drops the lock when the holder dies, however it
dies, so a crashed `rally up` never leaves a stale lock behind. The file names the holder's pid, for the
message only. The descriptor is not inherited by the cluster's processes (Python opens files
non-inheritable), so a leftover server never holds the lock on its own.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_NAME = "lock"


class FolderBusy(Exception):
    """Another process holds the folder's lock."""

    def __init__(self, folder: Path, holder: str) -> None:
        self.folder = folder
        self.holder = holder
        who = f"pid {holder}" if holder else "another process"
        stop = f"kill {holder}" if holder else "kill it"
        super().__init__(
            f"a local cluster already runs on {folder} ({who}); stop it first (Ctrl-C in its terminal, "
            f"or {stop}), or start this one from another folder"
        )


def lock_folder(folder: Path) -> IO[str]:
    """Take ``folder``'s lock (creating the folder) or raise ``FolderBusy``; keep the returned file open
    for as long as the folder is ours (closing it, or exiting, releases the lock)."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 - held past this function
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise FolderBusy(folder.resolve(), holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
