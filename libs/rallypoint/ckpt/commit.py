"""The commit protocol: each rank's durable ``.done`` marker, then rank 0's ``manifest.json``.

A rank writes its marker only after its shard files are durable (fsynced and renamed), listing every
file it wrote with its size and sha256. Rank 0 (the committer) waits until every rank's marker *of this
attempt and step* is there (a marker left by an earlier attempt that died does not count), then writes
the manifest atomically. The manifest is the commit point: without it the step does not exist.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .files import read_json, sha256_file, write_atomic
from .manifest import FORMAT, MANIFEST, marker_name

POLL_S = 0.02


def write_marker(folder: Path, *, rank: int, step: int, attempt: int, files: Sequence[str]) -> dict[str, Any]:
    """Record ``files`` (already durable in ``folder``) as this rank's complete part of ``step``."""
    records = [
        {"name": n, "bytes": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in files
    ]
    marker = {"format": FORMAT, "rank": rank, "step": step, "attempt": attempt, "files": records}
    write_atomic(folder / marker_name(rank), json.dumps(marker, sort_keys=True).encode())
    return marker


def await_markers(
    folder: Path, *, world_size: int, step: int, attempt: int, timeout_s: float
) -> list[dict[str, Any]] | None:
    """Every rank's marker of this attempt and step, in rank order; None once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    found: dict[int, dict[str, Any]] = {}
    while True:
        for rank in range(world_size):
            marker = found.get(rank) or _current(read_json(folder / marker_name(rank)), rank, step, attempt)
            if marker is not None:
                found[rank] = marker
        if len(found) == world_size:
            return [found[rank] for rank in range(world_size)]
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def _current(marker: dict[str, Any] | None, rank: int, step: int, attempt: int) -> dict[str, Any] | None:
    """``marker`` if it is this rank's record of this step by this attempt."""
    if marker is None or not isinstance(marker.get("files"), list):
        return None
    ours = (marker.get("rank"), marker.get("step"), marker.get("attempt")) == (rank, step, attempt)
    return marker if ours else None


def build_manifest(
    *,
    job_id: str,
    step: int,
    attempt: int,
    markers: Sequence[dict[str, Any]],
    metadata: dict[str, Any] | None,
    created_at: float,
) -> dict[str, Any]:
    shards = [
        {"rank": marker["rank"], "file": f["name"], "bytes": f["bytes"], "sha256": f["sha256"]}
        for marker in markers
        for f in marker["files"]
    ]
    manifest = {
        "format": FORMAT,
        "job_id": job_id,
        "step": step,
        "attempt": attempt,
        "world_size": len(markers),
        "created_at": created_at,
        "shards": shards,
    }
    if metadata is not None:
        manifest["metadata"] = metadata
    return manifest


def write_manifest(folder: Path, manifest: dict[str, Any]) -> bytes:
    """Commit the step: the manifest, atomically. Returns the bytes written (their sha256 is reported)."""
    raw = json.dumps(manifest, sort_keys=True, indent=1).encode()
    write_atomic(folder / MANIFEST, raw)
    return raw
