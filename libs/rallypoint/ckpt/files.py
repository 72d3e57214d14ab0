"""Durable file primitives: a reader sees the old file or all of the new one, never half of it.

Standard library only: user training processes import this.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (on Linux the new name lives in the directory's own blocks)."""
    fsync_path(path)


def fsync_path(path: Path) -> None:
    """fsync a file or folder by name (one written by code we do not control, e.g. DCP)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(path: Path) -> Path:
    # pid in the name: two processes writing the same target never share a temporary file
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic_with(path: Path, fill: Callable[[IO[bytes]], Any]) -> None:
    """Durably replace ``path`` with what ``fill`` writes: tmp name, fsync, rename, fsync the folder."""
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Durably replace ``path`` with ``data``."""
    write_atomic_with(path, lambda handle: handle.write(data))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
