"""`rally why JOB`: why a job waits, with the numbers behind its reason, what would let it start, and
every reason it has had (``GET /v1/jobs/{id}/why``; docs/observability.md).

``-o json`` prints the API's answer unchanged. A ``Predicted start:`` line appears only when the cluster
predicts one; it does not yet, so the line is absent rather than a guess.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url
from .jobs_cmds import EXIT_ERROR, EXIT_OK, _api_arg, format_elapsed, format_table, pending_text, start_text
from .output import add_output_args, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    why = subparsers.add_parser(
        "why",
        help="why a job waits: its reason's numbers, what would let it start, its reason history",
        description="Explain a job's pending reason: GPUs asked and free, quota used, nominal and "
        "borrowable, what would let it start, and when each of its reasons began and ended.",
    )
    why.add_argument("job_id", metavar="JOB")
    add_output_args(why)
    _api_arg(why)
    why.set_defaults(func=cmd_why)


def cmd_why(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    try:
        answer = client.request("GET", f"/v1/jobs/{urllib.parse.quote(args.job_id, safe='')}/why").body
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    emit(args, answer, lambda why: format_why(why, now=time.time()))
    return EXIT_OK


# --- the table ------------------------------------------------------------------------------------


def clock(at: float | None) -> str:
    return "-" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


def format_why(why: dict[str, Any], *, now: float) -> str:
    """The explanation as a person reads it: the reason, its numbers, what would let it start, the
    history; blocks separated by a blank line."""
    blocks = [headline(why, now=now)]
    explanation = why.get("explanation")
    if explanation:
        blocks += [numbers(explanation), would_start(explanation["would_start"])]
    if why.get("predicted_start") is not None:
        blocks.append(f"Predicted start: {start_text(why['predicted_start'], now=now, long=True)}")
    blocks.append(history(why.get("history") or [], now=now))
    return "\n\n".join(blocks)


def headline(why: dict[str, Any], *, now: float) -> str:
    state = str(why["state"])
    reason = why.get("reason")
    if state != "pending" or not reason:
        return f"{why['job_id']} is {state}: nothing holds it back now."
    since = reason.get("updated_at")
    waited = "" if since is None else f" (said at {clock(since)}, {format_elapsed(now - since)} ago)"
    ahead = reason.get("jobs_ahead")
    place = None if ahead is None else ahead + 1  # as `rally jobs` shows it: 1 = next
    shown = pending_text({"pending_reason": reason, "queue_position": place})
    return f"{why['job_id']} is pending: {shown}{waited}"


def numbers(explanation: dict[str, Any]) -> str:
    asked, per_task = explanation["asked"], explanation["gpus_per_task"]
    rows: list[tuple[str, str]] = [("asked", f"{asked} GPUs, {asked // per_task} task(s) of {per_task}")]
    for room in explanation["gpus"]:
        where = "" if room["level"] == "cluster" else f"; best {room['level']} has {room['best_free']} free"
        fits = "" if room["fits"] or room["short"] else "; its tasks do not place (fragmented)"
        rows.append(
            (
                f"{room['gpu_type']} GPUs",
                f"{room['free']} free of {room['schedulable']} schedulable{where}{fits}",
            )
        )
    for quota in explanation["quotas"]:
        rows.append((f"quota {quota['queue']} ({quota['gpu_type']})", quota_text(quota)))
    return "Numbers\n" + "\n".join(f"  {name.ljust(24)}{text}" for name, text in rows)


def quota_text(quota: dict[str, Any]) -> str:
    """A quota row in GPUs (a share or a MIG slice counts for its part of one: ``2.25``)."""
    limit = quota["borrowing_limit"]
    orgs = "".join(f"; org {o['org']} uses {o['used']:g} of {o['cap']:g}" for o in quota["orgs"])
    return (
        f"uses {quota['used']:g} of nominal {quota['nominal']:g}; borrowing limit "
        f"{'none' if limit is None else format(limit, 'g')}; cohort can lend {quota['cohort_lendable']:g}"
        f"{orgs}; room now {quota['room']:g}"
    )


def would_start(lines: Sequence[str]) -> str:
    return "What would let it start\n" + "\n".join(f"  - {line}" for line in lines)


def history(spans: Sequence[dict[str, Any]], *, now: float) -> str:
    if not spans:
        return "Reason history: none yet (the scheduler has not looked at it)"
    rows = [
        (
            clock(span["since"]),
            clock(span["until"]) if span["until"] is not None else "now",
            format_elapsed((span["until"] if span["until"] is not None else now) - span["since"]),
            span["ended_by"] or "-",
            span["code"],
            span["message"],
        )
        for span in spans
    ]
    table = format_table(("SINCE", "UNTIL", "FOR", "ENDED_BY", "CODE", "LAST MESSAGE"), rows)
    return "Reason history\n" + "\n".join(f"  {line}" for line in table.splitlines())
