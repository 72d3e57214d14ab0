"""`rally checkpoints JOB`: a job's checkpoints as the log tells them, and the one a restart resumes from.

Step folders that never committed (a save cut short) are not in the log: where this machine can read
the job's checkpoint folder, they are listed from the disk as INCOMPLETE.

Exit codes as the other job commands: 0 ok; 2 the request was refused (an unknown job) or could not be
made.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rallypoint.ckpt.abandoned import incomplete_steps

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url, stale_params
from .jobs_cmds import EXIT_ERROR, EXIT_OK, _api_arg, format_table
from .output import add_output_args, wants_json
from .stale import add_stale_arg, error_line, note_stale

LATEST_MARK = "*"
INCOMPLETE = "INCOMPLETE"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "checkpoints",
        help="list a job's checkpoints and its latest complete one",
        description="List a job's checkpoints, oldest step first. The latest complete one (what a "
        f"restart resumes from) is marked {LATEST_MARK}. Step folders a save left without a manifest are "
        f"listed as {INCOMPLETE} when this machine can read the job's checkpoint folder.",
    )
    parser.add_argument("job_id", metavar="JOB")
    add_output_args(parser)
    add_stale_arg(parser)
    _api_arg(parser)
    parser.set_defaults(func=cmd_checkpoints)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    path = f"/v1/jobs/{urllib.parse.quote(args.job_id, safe='')}/checkpoints"
    try:
        body: dict[str, Any] = client.request("GET", path, params=stale_params(args.stale)).body
    except ApiError as err:
        if err.status == 404:
            print(f"error: no job {args.job_id!r} (list jobs with `rally jobs --all`)", file=sys.stderr)
        else:
            print(error_line(err, args), file=sys.stderr)
        return EXIT_ERROR
    except ApiUnreachable as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    note_stale(args, body)
    incomplete = incomplete_on_disk(body["checkpoints"])
    if wants_json(args):
        print(json.dumps({**body, "incomplete": incomplete}, indent=2))
    else:
        print(format_checkpoints(body["checkpoints"], body.get("latest_complete"), incomplete))
    return EXIT_OK


def incomplete_on_disk(checkpoints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step folders without a manifest beside the job's committed ones, where this machine can read
    them (the log never hears of a save that did not commit); steps the log lists are its to describe."""
    listed = {c["step"] for c in checkpoints}
    folders = sorted({str(Path(c["path"]).parent) for c in checkpoints if c.get("path")})
    found = [step for folder in folders for step in incomplete_steps(folder) if step.step not in listed]
    return [
        {"step": s.step, "path": str(s.path), "ranks_done": list(s.ranks), "bytes": s.bytes}
        for s in sorted(found, key=lambda s: s.step)
    ]


def format_checkpoints(
    checkpoints: Sequence[dict[str, Any]], latest: int | None, incomplete: Sequence[dict[str, Any]] = ()
) -> str:
    headers = ("", "STEP", "ATTEMPT", "STATUS", "SIZE", "SHARDS", "SAVE", "COMMITTED", "ERROR")
    rows = [
        (
            LATEST_MARK if c["step"] == latest else "",
            c["step"],
            c["attempt"],
            str(c["status"]).upper(),
            format_size(int(c["bytes"])),
            c["shards"],
            f"{float(c['save_s']):.1f}s",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(c["committed_at"]))),
            c.get("error") or "",
        )
        for c in checkpoints
    ]
    rows += [_incomplete_row(folder) for folder in incomplete]
    rows.sort(key=lambda row: int(row[1]))
    footer = (
        f"{LATEST_MARK} latest complete: step {latest} (a restart resumes from it)"
        if latest is not None
        else "no complete checkpoint: a restart starts from the beginning"
    )
    return f"{format_table(headers, rows)}\n{footer}"


def _incomplete_row(folder: dict[str, Any]) -> tuple[Any, ...]:
    done = ", ".join(str(rank) for rank in folder["ranks_done"]) or "none"
    note = f"never committed: no manifest (ranks with a durable part: {done})"
    return ("", folder["step"], "", INCOMPLETE, format_size(int(folder["bytes"])), "", "", "", note)


def format_size(size: int) -> str:
    """Binary units, one decimal: ``512 B``, ``1.5 KiB``, ``3.0 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
