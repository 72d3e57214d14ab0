"""Reading what training ranks report through ``RALLY_REPORT_FILE``: checkpoint commits and progress.

Each rank appends JSON lines (``rallypoint.ckpt``) to its own file, ``rank-<r>.report`` in its attempt
directory: ``{"kind": "checkpoint", ...}`` when it committed a step, ``{"kind": "step", ...}`` for its
progress (about once a second).

Reading is two-phase so nothing is lost or appended twice: ``read`` returns the complete new lines
(a line still being written has no newline yet and waits for the next pass) without moving the offset;
the agent appends the batch's commits, then ``advance`` moves the offset past them and saves it in
``rank-<r>.report-offset`` beside the file. A restarted agent resumes from the saved offset, so it
neither re-appends the commits before it nor skips the lines after it; dying between the append and
the save re-appends with the same message id, which the log's duplicate window absorbs. The offset is
saved (fsynced) after every commit and at most every ``OFFSET_SAVE_INTERVAL_S`` for progress alone,
with the latest progress line, so a restart shows progress again at once.

The file is the rank's, so its (job, attempt) identity comes from where the file is, not from what the
lines say: a line naming another job or attempt is skipped. A malformed line is skipped with a warning,
never fatal; a "line" longer than ``MAX_LINE_BYTES`` is dropped up to its newline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from rallypoint.agent import workdir
from rallypoint.events import CheckpointCommitted

_log = logging.getLogger(__name__)

# The fields of a checkpoint report line that CheckpointCommitted carries (the agent adds node_id).
CHECKPOINT_FIELDS = (
    "job_id",
    "attempt",
    "step",
    "path",
    "manifest_sha256",
    "bytes",
    "shards",
    "save_s",
    "at",
)
# Report lines are a few hundred bytes; reading is capped per pass so a runaway file cannot eat memory.
MAX_LINE_BYTES = 1 << 20
OFFSET_SAVE_INTERVAL_S = 30.0


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """A rank's latest ``step`` line: the step reached, seconds per step, and when (rank's clock)."""

    step: int
    step_time_s: float
    at: float


@dataclass(frozen=True)
class ReportSource:
    """One rank's report file and where its read offset is saved."""

    job_id: str
    attempt: int
    rank: int
    path: Path
    offset_path: Path

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.rank)


@dataclass(frozen=True)
class ReportBatch:
    """The complete lines of one file between ``start`` and ``end``, parsed."""

    source: ReportSource
    start: int
    end: int
    commits: tuple[CheckpointCommitted, ...] = ()
    progress: Progress | None = None
    # the bytes read were the head of an over-long line: drop the rest of it up to its newline
    discarding: bool = False


@dataclass
class _FileState:
    offset: int
    saved_offset: int
    saved_at: float
    discarding: bool = False


@dataclass
class ReportTail:
    """Offsets of the report files being tailed, and each rank's latest progress."""

    node_id: str
    clock: Callable[[], float] = time.time
    progress: dict[tuple[str, int, int], Progress] = field(default_factory=dict)
    _files: dict[Path, _FileState] = field(default_factory=dict)

    def read(self, source: ReportSource) -> ReportBatch:
        """The complete lines after the current offset (the offset does not move: see ``advance``)."""
        state = self._state(source)
        chunk = _read_chunk(source.path, state.offset)
        skipped = 0
        if state.discarding:
            newline = chunk.find(b"\n")
            if newline < 0:
                return ReportBatch(source, state.offset, state.offset + len(chunk), discarding=True)
            skipped = newline + 1
        end = chunk.rfind(b"\n")
        if end < skipped:
            if len(chunk) - skipped >= MAX_LINE_BYTES:
                _log.warning("%s: a line longer than %d bytes; dropping it", source.path, MAX_LINE_BYTES)
                return ReportBatch(source, state.offset, state.offset + len(chunk), discarding=True)
            return ReportBatch(source, state.offset, state.offset + skipped)
        commits: list[CheckpointCommitted] = []
        progress: Progress | None = None
        for raw in chunk[skipped : end + 1].splitlines():
            parsed = parse_line(raw, source, self.node_id)
            if isinstance(parsed, CheckpointCommitted):
                commits.append(parsed)
            elif isinstance(parsed, Progress):
                progress = parsed
        return ReportBatch(source, state.offset, state.offset + end + 1, tuple(commits), progress)

    def advance(self, batch: ReportBatch) -> None:
        """Move past a batch whose commits are in the log; save the offset when it is worth a write."""
        state = self._state(batch.source)
        if state.offset != batch.start:
            return  # a stale batch (read twice before advancing): its lines are read again, harmlessly
        state.offset = batch.end
        state.discarding = batch.discarding
        if batch.progress is not None:
            self.progress[batch.source.key] = batch.progress
        now = self.clock()
        due = state.offset != state.saved_offset and now - state.saved_at >= OFFSET_SAVE_INTERVAL_S
        if batch.commits or due:
            self._save(batch.source, state, now)

    def retain(self, sources: Iterable[ReportSource]) -> None:
        """Forget the files and progress of ranks no longer tailed (finished and reported)."""
        sources = list(sources)
        paths = {s.path for s in sources}
        keys = {s.key for s in sources}
        for path in [p for p in self._files if p not in paths]:
            del self._files[path]
        for key in [k for k in self.progress if k not in keys]:
            del self.progress[key]

    def _state(self, source: ReportSource) -> _FileState:
        state = self._files.get(source.path)
        if state is None:
            state = self._files[source.path] = self._load(source)
        return state

    def _load(self, source: ReportSource) -> _FileState:
        saved = workdir.read_record(source.offset_path) or {}
        offset = _saved_offset(source, saved.get("offset"))
        with contextlib.suppress(msgspec.ValidationError):
            self.progress[source.key] = msgspec.convert(saved.get("progress"), Progress)
        return _FileState(offset=offset, saved_offset=offset, saved_at=self.clock())

    def _save(self, source: ReportSource, state: _FileState, now: float) -> None:
        progress = self.progress.get(source.key)
        record: dict[str, Any] = {
            "offset": state.offset,
            "progress": msgspec.to_builtins(progress) if progress is not None else None,
            "at": now,
        }
        workdir.write_atomic(source.offset_path, record)
        state.saved_offset = state.offset
        state.saved_at = now


def _saved_offset(source: ReportSource, offset: Any) -> int:
    if not isinstance(offset, int) or offset <= 0:
        return 0
    try:
        size = source.path.stat().st_size
    except FileNotFoundError:
        size = 0
    if offset > size:
        # Shorter than what was read from it: the file was replaced, not appended to. Start over.
        _log.warning("%s is shorter (%d) than its saved offset (%d); rereading", source.path, size, offset)
        return 0
    return offset


def _read_chunk(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(MAX_LINE_BYTES + 1)
    except FileNotFoundError:
        return b""  # the rank has not reported anything yet


def parse_line(raw: bytes, source: ReportSource, node_id: str) -> CheckpointCommitted | Progress | None:
    """One report line as the event or progress it stands for; None (with a warning) if it is not one."""
    try:
        line = msgspec.json.decode(raw)
        why = _foreign(line, source)
        if why is None:
            return _convert(line, node_id)
    except msgspec.DecodeError:
        why = "not JSON"
    except msgspec.ValidationError as exc:
        why = f"invalid ({exc})"
    _log.warning("%s: skipping a report line: %s: %r", source.path, why, raw[:200])
    return None


def _foreign(line: Any, source: ReportSource) -> str | None:
    if not isinstance(line, dict):
        return "not an object"
    if (line.get("job_id"), line.get("attempt"), line.get("rank", source.rank)) != source.key:
        return f"the line is not of rank {source.key}"
    if line.get("kind") not in ("checkpoint", "step"):
        return f"unknown kind {line.get('kind')!r}"
    return None


def _convert(line: dict[str, Any], node_id: str) -> CheckpointCommitted | Progress:
    if line["kind"] == "checkpoint":
        fields = {k: line.get(k) for k in CHECKPOINT_FIELDS} | {"node_id": node_id}
        return msgspec.convert(fields, CheckpointCommitted)
    return msgspec.convert(line, Progress)
