"""`rally show | history | usage | queues | logs`: what Slurm users reach for (scontrol show job, sacct,
sreport, sshare / kueuectl, and the rank output), each with ``-o json`` (or ``--json``) printing the API's
JSON as is.

`rally usage --postgres-dsn` answers from the PostgreSQL read model instead of the API (the log): the two
are equal to the bit (``projection.usage``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from .account_format import format_history, format_queues, format_show, format_usage
from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url, stale_params
from .jobs_cmds import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, _api_arg, parse_duration
from .output import add_output_args, emit, wants_json
from .stale import add_stale_arg, error_line, note_stale

GROUP_BY = ("team", "user", "class")
TERMINAL = ("completed", "failed", "cancelled", "rejected")


def parse_time(text: str, *, now: Callable[[], float] = time.time) -> float:
    """Epoch seconds from ``now``, epoch seconds, an ISO 8601 time (local unless it names a zone), or a
    duration ago: ``1d``, ``90m``, ``2h30m``."""
    text = text.strip()
    if text == "now":
        return now()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            return now() - parse_duration(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"not a time: {text!r} (try 2026-11-25T08:00, 1700000000, or 1d / 2h ago)"
            ) from None
    return parsed.timestamp() if parsed.tzinfo is not None else parsed.astimezone().timestamp()


def _window_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since", "-S", type=parse_time, help="from (ISO time, epoch seconds or e.g. 1d ago)"
    )
    parser.add_argument("--until", "-E", type=parse_time, help="until (same forms; default now)")


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    show = subparsers.add_parser("show", help="a job's whole history (like scontrol show job)")
    show.add_argument("job_id")
    add_output_args(show)
    _api_arg(show)
    show.set_defaults(func=cmd_show)

    history = subparsers.add_parser("history", help="finished jobs with accounting columns (like sacct)")
    history.add_argument("--team", help="only this team's jobs")
    history.add_argument("--state", help=f"comma list of end states ({', '.join(TERMINAL)})")
    history.add_argument("--limit", type=int, default=1000, help="the newest N (default %(default)s)")
    _window_args(history)
    add_output_args(history)
    _api_arg(history)
    history.set_defaults(func=cmd_history)

    usage = subparsers.add_parser("usage", help="GPU-hours by team, user or class (like sreport)")
    usage.add_argument("--by", choices=GROUP_BY, default="team", help="group by (default %(default)s)")
    usage.add_argument("--team", help="only this team's attempts (a team token sees only its own)")
    usage.add_argument("--price-per-gpu-hour", type=float, help="show a showback cost at this price")
    usage.add_argument(
        "--postgres-dsn",
        default=None,
        help="answer from the PostgreSQL read model instead of the API (default: the API, from the log)",
    )
    _window_args(usage)
    add_output_args(usage)
    _api_arg(usage)
    usage.set_defaults(func=cmd_usage)

    queues = subparsers.add_parser("queues", help="nominal, borrowed, used, pending per team and cohort")
    add_output_args(queues)
    add_stale_arg(queues)
    _api_arg(queues)
    queues.set_defaults(func=cmd_queues)

    logs = subparsers.add_parser("logs", help="a rank's output, from its node's agent")
    logs.add_argument("job_id")
    logs.add_argument(
        "--rank",
        type=int,
        default=None,
        help="which rank (default: the one whose exit failed the attempt, else 0)",
    )
    logs.add_argument("--attempt", type=int, help="which attempt (default: the current one)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the attempt ends")
    logs.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    add_output_args(logs)
    _api_arg(logs)
    logs.set_defaults(func=cmd_logs)


def _get(args: argparse.Namespace, path: str, params: dict[str, Any] | None = None) -> Any:
    return ApiClient(resolve_api_url(args.api_url)).request("GET", path, params=params).body


def _run(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """One place that turns the client's errors into a line on stderr and exit code 2."""
    try:
        return body()
    except (ApiError, ApiUnreachable) as err:
        print(error_line(err, args), file=sys.stderr)
        return EXIT_ERROR


def _job_path(job_id: str, tail: str = "") -> str:
    return f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}{tail}"


def cmd_show(args: argparse.Namespace) -> int:
    return _run(args, lambda: emit(args, _show(args), format_show))


def _show(args: argparse.Namespace) -> dict[str, Any]:
    """The job's history; a waiting job's also with its predicted start (the job view carries that)."""
    history: dict[str, Any] = _get(args, _job_path(args.job_id, "/history"))
    if history.get("state") == "pending":
        history["predicted_start"] = _get(args, _job_path(args.job_id)).get("predicted_start")
    return history


def cmd_history(args: argparse.Namespace) -> int:
    params = {
        "team": args.team,
        "state": args.state,
        "since": args.since,
        "until": args.until,
        "limit": args.limit,
    }

    def body() -> int:
        answer = _get(args, "/v1/history", params)
        return emit(args, answer, lambda a: format_history(a["jobs"]))

    return _run(args, body)


def cmd_usage(args: argparse.Namespace) -> int:
    if args.postgres_dsn:
        return emit(args, _read_model_usage(args), format_usage)
    params = {
        "by": args.by,
        "team": args.team,
        "since": args.since,
        "until": args.until,
        "price_per_gpu_hour": args.price_per_gpu_hour,
    }
    return _run(args, lambda: emit(args, _get(args, "/v1/usage", params), format_usage))


def _read_model_usage(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import msgspec

    from rallypoint.projection.store import connect
    from rallypoint.projection.usage import read_model_usage

    async def query() -> dict[str, Any]:
        conn = await connect(args.postgres_dsn, application_name="rally-usage")
        try:
            report = await read_model_usage(
                conn,
                args.by,
                args.since,
                args.until,
                now=time.time(),
                price_per_gpu_hour=args.price_per_gpu_hour,
            )
        finally:
            await conn.close()
        built: dict[str, Any] = msgspec.to_builtins(report)
        return built

    return asyncio.run(query())


def cmd_queues(args: argparse.Namespace) -> int:
    def queues() -> int:
        body = _get(args, "/v1/queues", stale_params(args.stale))
        note_stale(args, body)
        return emit(args, body, format_queues)

    return _run(args, queues)


def cmd_logs(args: argparse.Namespace) -> int:
    """Print the rank's log from the start; with --follow, keep polling from the last offset until the
    attempt has ended and every byte was read. ``-o json`` prints one JSON object per chunk."""
    offset = 0
    path = _job_path(args.job_id, "/logs")
    try:
        while True:
            params = {"rank": args.rank, "attempt": args.attempt, "offset": offset}
            try:
                chunk = _get(args, path, params)
            except ApiError as err:
                if args.follow and err.status == 409:  # not placed yet: wait for its first attempt
                    time.sleep(args.poll)
                    continue
                raise
            if args.attempt is None:
                args.attempt = chunk["attempt"]  # stay on the attempt we started with
            if args.rank is None:
                args.rank = chunk["rank"]  # and on its rank, even if another one fails meanwhile
                if args.rank == chunk.get("failed_rank") and not wants_json(args):
                    shown = f"rank {args.rank}, whose exit failed attempt {args.attempt}"
                    print(f"(showing {shown}; --rank N for another)", file=sys.stderr)
            if wants_json(args):
                print(json.dumps(chunk), flush=True)
            elif chunk["text"]:
                sys.stdout.write(chunk["text"])
                sys.stdout.flush()
            moved = chunk["next_offset"] > offset
            offset = chunk["next_offset"]
            if chunk["eof"] or (not args.follow and (offset >= chunk["size"] or not moved)):
                return EXIT_OK
            if not moved:
                time.sleep(args.poll)
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
