"""The on-disk checkpoint format: step folders, durable shards, one manifest per complete step.

Standard library only: the training side imports this in user processes, the checkpoint service reads
it to verify. Layout under a job's checkpoint folder (``RALLY_CHECKPOINT_DIR``)::

    step-000000000120/
        rank-00000.npz      each rank's shard file(s) (written to a temporary name, fsynced, renamed)
        rank-00000.done     the rank's durable record: {"attempt", "rank", "step", "files": [...]}
        ...
        manifest.json       written last, by rank 0, once every rank's .done of this attempt is there

A step exists only when ``manifest.json`` does; a save killed half-way leaves no manifest and is never
loaded. ``verify_checkpoint`` re-reads every shard against the sizes and digests the manifest records.
docs/training-client.md describes the format.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from .files import fsync_dir, read_json, sha256_file, write_atomic

FORMAT = "rallypoint-checkpoint/1"
MANIFEST = "manifest.json"
_PREFIX = "step-"

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VerifyResult",
    "fsync_dir",
    "list_steps",
    "marker_name",
    "read_json",
    "sha256_file",
    "shard_name",
    "step_dir",
    "step_of",
    "verify_checkpoint",
    "write_atomic",
]


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"{_PREFIX}{step:012d}"


def step_of(folder: str | Path) -> int | None:
    """The step a folder named ``step-<digits>`` holds; None for any other name."""
    name = Path(folder).name
    digits = name[len(_PREFIX) :]
    return int(digits) if name.startswith(_PREFIX) and digits.isdigit() else None


def shard_name(rank: int, suffix: str) -> str:
    return f"rank-{rank:05d}.{suffix}"


def marker_name(rank: int) -> str:
    return shard_name(rank, "done")


def list_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a committed manifest, ascending (whether their shards still verify or not)."""
    root = Path(checkpoint_dir)
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    steps = [step_of(child) for child in children if (child / MANIFEST).is_file()]
    return sorted(step for step in steps if step is not None)


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    error: str
    step: int | None
    bytes: int
    shards: int
    manifest_sha256: str


class _Invalid(Exception):
    """Bad data found while verifying: becomes ``VerifyResult.error``."""


def verify_checkpoint(folder: str | Path) -> VerifyResult:
    """Whether the step in ``folder`` is complete and intact. Never raises for bad data."""
    path = Path(folder)
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError as exc:
        return VerifyResult(False, f"no manifest: {exc.strerror or exc}", None, 0, 0, "")
    digest = hashlib.sha256(raw).hexdigest()
    step: int | None = None
    shards: list[dict[str, Any]] = []
    try:
        step, world_size, shards = _parse(raw)
        _check_step(path, step)
        total = _check_shards(path, shards, world_size)
    except _Invalid as exc:
        return VerifyResult(False, str(exc), step, 0, len(shards), digest)
    return VerifyResult(True, "", step, total, len(shards), digest)


def _parse(raw: bytes) -> tuple[int, int, list[dict[str, Any]]]:
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise _Invalid(f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise _Invalid("unreadable manifest: not a JSON object")
    if manifest.get("format") != FORMAT:
        raise _Invalid(f"unknown format {manifest.get('format')!r}")
    step, world_size, shards = manifest.get("step"), manifest.get("world_size"), manifest.get("shards")
    if not _is_int(step) or not _is_int(world_size) or world_size < 1:
        raise _Invalid("unreadable manifest: step and world_size must be integers")
    if not isinstance(shards, list) or not shards or not all(isinstance(s, dict) for s in shards):
        raise _Invalid("unreadable manifest: shards must be a non-empty list of objects")
    return step, world_size, shards


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_step(folder: Path, step: int) -> None:
    named = step_of(folder)
    if named is not None and named != step:
        raise _Invalid(f"the manifest says step {step}, the folder is step {named}")


def _check_shards(folder: Path, shards: list[dict[str, Any]], world_size: int) -> int:
    """Cheap checks (names, sizes, markers) for every shard first, then the digests: a missing shard
    is reported without reading gigabytes first."""
    records = [_shard_record(shard, world_size) for shard in shards]
    for rank in range(world_size):
        if not (folder / marker_name(rank)).is_file():
            raise _Invalid(f"rank {rank} has no {marker_name(rank)} marker")
    for name, size, _ in records:
        actual = _size(folder / name)
        if actual is None:
            raise _Invalid(f"shard {name} is missing")
        if actual != size:
            raise _Invalid(f"shard {name} has {actual} bytes, the manifest says {size}")
    for name, _, expected in records:
        try:
            matches = sha256_file(folder / name) == expected
        except OSError as exc:
            raise _Invalid(f"shard {name} is unreadable: {exc.strerror or exc}") from None
        if not matches:
            raise _Invalid(f"shard {name} does not match its sha256")
    return sum(size for _, size, _ in records)


def _shard_record(shard: dict[str, Any], world_size: int) -> tuple[str, int, str]:
    name, size, digest, rank = shard.get("file"), shard.get("bytes"), shard.get("sha256"), shard.get("rank")
    if not isinstance(name, str) or not _is_int(size) or not isinstance(digest, str) or not _is_int(rank):
        raise _Invalid(f"bad shard record {shard!r}")
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise _Invalid(f"shard file {name!r} is not a plain name in the step folder")
    if not 0 <= rank < world_size:
        raise _Invalid(f"shard {name} belongs to rank {rank}, outside the world size {world_size}")
    return name, size, digest


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None
