"""Step folders that never committed: listed, and removed once a later step has committed.

A save cut short (ranks killed mid-write, a lost node, a stale rank of an attempt already replaced, a
stop whose ranks saved different steps) leaves a step folder with some ranks' files and no manifest.
Nothing loads it (a step exists only with its manifest), and nothing removed it either: one-shard
``step-N`` folders stayed for good. Once a later step has committed, such a folder is superseded: no
rank of the committing attempt still writes it (each rank writes its steps in order, and all of them
are past it) and a resume never goes back to it. The committer removes those (``remove_abandoned``);
``incomplete_steps`` lists the ones still there, newer than every commit (``rally checkpoints`` shows
them as incomplete).

Standard library only: training processes import it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from .files import read_json
from .manifest import MANIFEST, marker_name, step_of

_log = logging.getLogger("rallypoint.ckpt")


@dataclass(frozen=True)
class IncompleteStep:
    """A step folder without a manifest: what a save left before it could commit."""

    step: int
    path: Path
    ranks: tuple[int, ...]  # the ranks whose ``.done`` marker is there (their part is durable)
    bytes: int


def incomplete_steps(checkpoint_dir: str | Path) -> list[IncompleteStep]:
    """The step folders under ``checkpoint_dir`` that hold no manifest, oldest first."""
    return [_describe(step, folder) for step, folder in _uncommitted(Path(checkpoint_dir))]


def remove_abandoned(checkpoint_dir: str | Path, *, below: int, in_flight: Collection[int] = ()) -> list[int]:
    """Remove the folders of steps older than ``below`` (a committed step) that hold no manifest, but
    not those of ``in_flight`` (saves of this process whose commit may still come); the steps removed.
    A folder that cannot be removed now (a stale rank still writing into it) is left for the next commit."""
    removed = []
    for step, folder in _uncommitted(Path(checkpoint_dir)):
        if step >= below or step in in_flight:
            continue
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            _log.warning("could not remove the uncommitted folder %s: %s", folder, exc)
            continue
        removed.append(step)
    if removed:
        _log.info("removed the folders of steps %s: never committed, and step %d has", removed, below)
    return removed


def _uncommitted(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every real step folder (no link) without a manifest, by step."""
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    found = []
    for child in children:
        step = step_of(child)
        if step is not None and _without_manifest(child):
            found.append((step, child))
    return sorted(found)


def _without_manifest(folder: Path) -> bool:
    """A real folder (no link) holding no manifest. One we may not look into is not ours to judge: a
    save goes on and so does the commit, so nothing here raises."""
    try:
        return not folder.is_symlink() and folder.is_dir() and not (folder / MANIFEST).exists()
    except OSError:
        return False


def _describe(step: int, folder: Path) -> IncompleteStep:
    return IncompleteStep(step, folder, _ranks_done(folder), _size(folder))


def _ranks_done(folder: Path) -> tuple[int, ...]:
    """The ranks with a readable marker under their own name in ``folder``."""
    ranks = []
    for path in folder.glob("*.done"):
        rank = (read_json(path) or {}).get("rank")
        if isinstance(rank, int) and path.name == marker_name(rank):
            ranks.append(rank)
    return tuple(sorted(ranks))


def _size(folder: Path) -> int:
    total = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue  # removed while we looked
    return total
