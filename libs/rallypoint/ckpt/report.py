"""What a rank tells its node agent: JSON lines appended to ``RALLY_REPORT_FILE``.

Two kinds of line (the agent, ``rallypoint.agent.reports``, tails the file; docs/training-client.md
has the contract)::

    {"kind": "checkpoint", "job_id", "attempt", "rank", "step", "path", "manifest_sha256",
     "bytes", "shards", "save_s", "at"}          one per committed step, by the committing rank
    {"kind": "step", "job_id", "attempt", "rank", "step", "step_time_s", "at"}
                                                 progress, at most one line a second

Each line is written with one ``write`` on a file opened for append, then flushed and fsynced: a
reader never sees half a line unless the process dies inside that call, and the agent skips such a
line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEP_INTERVAL_S = 1.0


class Reporter:
    def __init__(
        self,
        path: str | Path | None,
        *,
        job_id: str,
        attempt: int,
        rank: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path) if path else None
        self._identity = {"job_id": job_id, "attempt": attempt, "rank": rank}
        self._clock = clock
        self._lock = threading.Lock()  # the committer threads and the loop both report
        self._last_step_at: float | None = None

    def checkpoint(
        self, *, step: int, path: Path, manifest_sha256: str, size: int, shards: int, save_s: float
    ) -> None:
        self._append(
            kind="checkpoint",
            step=step,
            path=str(path.resolve()),
            manifest_sha256=manifest_sha256,
            bytes=size,
            shards=shards,
            save_s=round(save_s, 6),
        )

    def step(self, step: int, step_time_s: float) -> bool:
        """Progress, rate-limited to one line per ``STEP_INTERVAL_S``; whether a line was written."""
        now = time.monotonic()
        if self._last_step_at is not None and now - self._last_step_at < STEP_INTERVAL_S:
            return False
        self._last_step_at = now
        self._append(kind="step", step=step, step_time_s=round(step_time_s, 6))
        return True

    def _append(self, **fields: Any) -> None:
        if self.path is None:
            return
        line = {"kind": fields.pop("kind"), **self._identity, **fields, "at": self._clock()}
        data = (json.dumps(line) + "\n").encode()
        with self._lock, open(self.path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
