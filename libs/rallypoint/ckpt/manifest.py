"""The on-disk checkpoint format: step folders, durable shards, one manifest per complete step.

Standard library only: the training side imports this in user processes, the checkpoint service reads
it to verify. Layout under a job's checkpoint folder (``RALLY_CHECKPOINT_DIR``)::

    step-000000000120/
        rank-00000.npz      each rank's shard (written to a temporary name, fsynced, renamed)
        rank-00000.done     the rank's durable record: {"attempt", "file", "bytes", "sha256"}
        ...
        manifest.json       written last, by rank 0, once every rank's .done is there

A step exists only when ``manifest.json`` does; a save killed half-way leaves no manifest and is never
loaded. ``verify_checkpoint`` re-reads every shard against the sizes and digests the manifest records.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "rallypoint-checkpoint/1"
MANIFEST = "manifest.json"
_PREFIX = "step-"


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"{_PREFIX}{step:012d}"


def shard_name(rank: int, suffix: str) -> str:
    return f"rank-{rank:05d}.{suffix}"


def list_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a committed manifest, ascending (whether their shards still verify or not)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        if child.name.startswith(_PREFIX) and (child / MANIFEST).is_file():
            try:
                steps.append(int(child.name[len(_PREFIX) :]))
            except ValueError:
                continue
    return sorted(steps)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Durably replace ``path`` with ``data``: a reader sees the old file, or all of the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    error: str
    step: int | None
    bytes: int
    shards: int
    manifest_sha256: str


def verify_checkpoint(folder: str | Path) -> VerifyResult:
    """Whether the step in ``folder`` is complete and intact. Never raises for bad data."""
    path = Path(folder)
    manifest_path = path / MANIFEST
    try:
        raw = manifest_path.read_bytes()
    except OSError as exc:
        return VerifyResult(False, f"no manifest: {exc.strerror or exc}", None, 0, 0, "")
    digest = hashlib.sha256(raw).hexdigest()
    try:
        manifest = json.loads(raw)
        step = int(manifest["step"])
        shards = list(manifest["shards"])
    except (ValueError, KeyError, TypeError) as exc:
        return VerifyResult(False, f"unreadable manifest: {exc}", None, 0, 0, digest)
    if manifest.get("format") != FORMAT:
        return VerifyResult(False, f"unknown format {manifest.get('format')!r}", step, 0, len(shards), digest)
    total = 0
    for shard in shards:
        error = _shard_error(path, shard)
        if error:
            return VerifyResult(False, error, step, total, len(shards), digest)
        total += int(shard["bytes"])
    return VerifyResult(True, "", step, total, len(shards), digest)


def _shard_error(folder: Path, shard: dict[str, Any]) -> str:
    try:
        name, size, expected = str(shard["file"]), int(shard["bytes"]), str(shard["sha256"])
    except (KeyError, TypeError, ValueError):
        return f"bad shard record {shard!r}"
    file = folder / name
    if "/" in name or not file.is_file():
        return f"shard {name} is missing"
    if file.stat().st_size != size:
        return f"shard {name} has {file.stat().st_size} bytes, the manifest says {size}"
    if sha256_file(file) != expected:
        return f"shard {name} does not match its sha256"
    return ""
