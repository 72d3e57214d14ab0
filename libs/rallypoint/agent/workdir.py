"""The on-disk record of every rank a node agent started: the agent's memory across its own crashes.

Layout, one directory per (job, attempt)::

    <work_dir>/<job_id>/<attempt>/
        task.json          the LaunchTask as received, less its secrets (GPUs, command): for re-adoption
        rank-<r>.claim     written by the agent *before* it spawns the wrapper: "this rank was started"
        rank-<r>.pid       written by the wrapper once the command runs: wrapper and rank pids + start times
        rank-<r>.log       the rank's stdout and stderr (and the wrapper's own complaints)
        rank-<r>.kill      a kill was requested: grace and request time (survives an agent restart)
        rank-<r>.exit      how the rank ended: {"exit_code", "at"}; written once, never replaced
        rank-<r>.reported  RankExited for this rank is in the log; nothing left to do
        rank-<r>.report    the rank's own reports (RALLY_REPORT_FILE): JSON lines, appended by the rank
        rank-<r>.report-offset  how far the agent has read and appended them (see ``reports``)

Exit codes: a rank that exits normally reports its own code (0-255); a rank ended by signal N reports
``128 + N`` (the shell convention: SIGTERM -> 143, SIGKILL -> 137), so "non-zero means failure" holds for
every consumer; ``-1`` (``EXIT_LOST``) means the outcome is unknown because the wrapper vanished without
writing an exit file (node reboot, wrapper SIGKILLed). Wrapper failures to start the command use the
shell's 127 (not found) and 126 (not executable).

This module is imported by the wrapper process, so it uses the standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from rallypoint.ckpt.files import fsync_dir

EXIT_LOST = -1
#: Written by the local cluster's supervisor for every rank still running when it is stopped (Ctrl-C on
#: `rally up`), before it stops them: the infrastructure ended the rank, not its program.
EXIT_CLUSTER_STOPPED = -2
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def attempt_dir(work_dir: Path, job_id: str, attempt: int) -> Path:
    # Job ids become directory names: refuse anything that could climb out of the work dir.
    if not _SAFE_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} is not a safe path component")
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    return work_dir / job_id / str(attempt)


def rank_file(directory: Path, rank: int, kind: str) -> Path:
    return directory / f"rank-{rank}.{kind}"


def exit_code_of(returncode: int) -> int:
    """``subprocess`` returncode (negative for signals) -> the code we report (128 + signal)."""
    return 128 - returncode if returncode < 0 else returncode


def write_atomic(path: Path, record: dict[str, Any], *, exclusive: bool = False) -> bool:
    """Write JSON so readers see the old file or the complete new one, never a torn one.

    With ``exclusive`` the file is created only if absent (hard link of a finished temp file, which is
    atomic and fails on an existing name) and the return value says whether we were first. Both the file
    and its directory are fsynced: an exit code must survive a power cut as well as a crash.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(record, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return True


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, kernel start time) of a process from ``/proc/<pid>/stat``; None if gone.

    Zombies are included (state ``Z``): their entry stays until their parent reaps them.
    """
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ")".
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def process_start_time(pid: int) -> int | None:
    """Kernel start time (clock ticks since boot) of a live, non-zombie process; None if gone.

    A pid alone is not an identity: after a reboot or a long uptime the number is reused. Every pid we
    record comes with its start time, and we only signal or trust a process whose start time matches.
    """
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None
    return stat[2]


def same_process(pid: int | None, start_time: int | None) -> bool:
    if not pid:
        return False
    current = process_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


def signal_group(pgid: int | None, start_time: int | None, sig: signal.Signals) -> bool:
    """Signal a rank's process group unless its id now belongs to someone else.

    The group outlives its leader when the rank forked helpers (dataloader workers) that survive it,
    and the kernel never hands out a pid that is still in use as a group id; so the group is ours
    unless a live process with that pid has a *different* start time (the leader died, the group
    emptied and the number was reused).
    """
    if not pgid:
        return False
    current = process_start_time(pgid)
    if current is not None and start_time is not None and current != start_time:
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
