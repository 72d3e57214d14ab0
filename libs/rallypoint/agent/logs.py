"""Reading a rank's output for ``cmd.agent.<node>.logs`` (``rally logs``): bounded chunks from an offset.

The log is ``<work dir>/<job>/<attempt>/rank-<r>.log`` (``workdir``); the agent serves it as it grows, and
the client asks again from ``next_offset``. A chunk never ends inside a UTF-8 character: the bytes of an
incomplete one at the end are left for the next request.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from rallypoint.protocol import LogsReply, LogsRequest

from .workdir import attempt_dir, rank_file

#: The most one reply carries: NATS messages are 1 MiB by default, and a terminal needs far less.
MAX_CHUNK_BYTES = 256 * 1024


def read_log_chunk(work_dir: Path, request: LogsRequest) -> LogsReply:
    if request.rank < 0 or request.offset < 0 or request.max_bytes <= 0:
        return LogsReply(ok=False, error="rank, offset and max_bytes must be non-negative (max_bytes > 0)")
    try:
        path = rank_file(attempt_dir(work_dir, request.job_id, request.attempt), request.rank, "log")
    except ValueError as exc:
        return LogsReply(ok=False, error=str(exc))
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            start = min(request.offset, size)
            handle.seek(start)
            raw = handle.read(min(request.max_bytes, MAX_CHUNK_BYTES))
    except FileNotFoundError:
        return LogsReply(ok=True, found=False, offset=request.offset, next_offset=request.offset)
    except OSError as exc:
        return LogsReply(ok=False, error=f"cannot read {path.name}: {exc}")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(raw, final=False)
    held = len(decoder.getstate()[0])  # the bytes of a character cut at the end of the chunk
    return LogsReply(
        ok=True, found=True, offset=start, next_offset=start + len(raw) - held, size=size, text=text
    )
