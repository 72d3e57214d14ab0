"""Reading what training ranks report through ``RALLY_REPORT_FILE``: checkpoint commits and progress.

Each rank appends JSON lines (``rallypoint.ckpt``): ``{"kind": "checkpoint", ...}`` when it committed a
step, ``{"kind": "step", ...}`` for its progress. The agent keeps a byte offset per file and consumes
only complete lines, so a line being written is read on the next pass; a malformed line is skipped with a
warning, never fatal. Offsets live in memory: after an agent restart the lines are read again, and the
appends they cause are idempotent (message ids, and the fold keeps the first commit of a step).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)


@dataclass
class ReportTail:
    """Byte offsets of the report files read so far, and each rank's latest progress line."""

    offsets: dict[Path, int] = field(default_factory=dict)
    progress: dict[tuple[str, int, int], dict[str, Any]] = field(default_factory=dict)

    def read(self, path: Path) -> list[dict[str, Any]]:
        """The complete new lines of ``path`` (checkpoint lines returned; step lines kept as progress)."""
        offset = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offsets[path] = offset + end + 1
        commits: list[dict[str, Any]] = []
        for raw in chunk[: end + 1].splitlines():
            line = _parse(raw, path)
            if line is None:
                continue
            if line.get("kind") == "checkpoint":
                commits.append(line)
            elif line.get("kind") == "step":
                key = (str(line.get("job_id")), int(line.get("attempt", 0)), int(line.get("rank", 0)))
                self.progress[key] = line
        return commits


def _parse(raw: bytes, path: Path) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except ValueError:
        _log.warning("skipping a malformed line in %s: %r", path, raw[:200])
        return None
    return line if isinstance(line, dict) else None
