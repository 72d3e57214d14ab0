"""`rally projector rebuild|status`: operate the PostgreSQL read models from the command line.

``rebuild`` empties the views and the position in one transaction and projects the log again from
sequence 1, through the same ``Projector`` the service runs (so rebuild and incremental projection
cannot drift apart). A projector service left running meanwhile is safe: its next batch finds the
position moved and re-synchronises instead of writing over the rebuild.

``status`` names the events PostgreSQL refused, which the projection quarantined instead of projecting
(docs/projector.md says what an operator does about them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from rallypoint.cli.output import add_output_args, emit, wants_json

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def _add_connection_args(parser: argparse.ArgumentParser) -> None:
    # Resolved when the command runs (``_resolve``), like every other command's: flag, environment,
    # then ./.rally/cluster.json of a `rally up` here.
    parser.add_argument(
        "--nats-url",
        default=None,
        help=f"NATS server URL (env RALLY_NATS_URL, then .rally/cluster.json; default {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--postgres-dsn",
        default=None,
        help="PostgreSQL DSN of the read models (env RALLY_POSTGRES_DSN, then .rally/cluster.json)",
    )
    parser.add_argument("--stream", default="RALLY", help="JetStream stream of the log (default RALLY)")
    parser.add_argument(
        "--name",
        default="read_models",
        help="projection name: the key of its position row (default read_models)",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "projector",
        help="PostgreSQL read models and audit archive: rebuild, status",
        description="Operate the projector's PostgreSQL read models (rally.jobs, rally.nodes, rally.events).",
    )
    actions = parser.add_subparsers(dest="projector_action", metavar="ACTION")
    actions.required = True

    rebuild = actions.add_parser(
        "rebuild",
        help="empty the read models and project the whole log again",
        description="Truncate the views, snapshot and position in one transaction, then project the log "
        "from sequence 1 up to its last sequence at the start of the command.",
    )
    _add_connection_args(rebuild)
    rebuild.add_argument(
        "--keep-archive",
        action="store_true",
        help="keep rally.events rows (re-inserted idempotently) instead of truncating",
    )
    rebuild.add_argument(
        "--batch-size", type=int, default=2000, help="events per transaction (default %(default)s)"
    )
    add_output_args(rebuild)
    rebuild.set_defaults(func=_rebuild)

    status = actions.add_parser(
        "status", help="projection position against the log's last sequence, and quarantined events"
    )
    _add_connection_args(status)
    add_output_args(status)
    status.add_argument(
        "--limit",
        type=_positive_int,
        default=20,
        help="name at most this many quarantined events (default %(default)s)",
    )
    status.set_defaults(func=_status)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _resolve(args: argparse.Namespace) -> None:
    from rallypoint.cli.clusterinfo import default_nats_url, default_postgres_dsn

    args.nats_url = args.nats_url or default_nats_url()
    args.postgres_dsn = args.postgres_dsn or default_postgres_dsn()


def _require_dsn(args: argparse.Namespace) -> str | None:
    _resolve(args)
    if not args.postgres_dsn:
        print(
            "rally projector: --postgres-dsn, RALLY_POSTGRES_DSN or a .rally/cluster.json here is required",
            file=sys.stderr,
        )
        return None
    dsn: str = args.postgres_dsn
    return dsn


def _rebuild(args: argparse.Namespace) -> int:
    dsn = _require_dsn(args)
    if dsn is None:
        return 2
    return asyncio.run(_rebuild_async(args, dsn))


async def _rebuild_async(args: argparse.Namespace, dsn: str) -> int:
    from rallypoint.eventlog import EventLog, EventLogError
    from rallypoint.projection import TRANSIENT_ERRORS, ProjectionError, Projector, RetryPolicy

    started = time.monotonic()
    try:
        log = await EventLog.connect(
            args.nats_url, name="rally-projector-rebuild", stream=args.stream, create=False
        )
    except EventLogError as exc:
        print(f"rally projector rebuild: {exc}", file=sys.stderr)
        return 1
    # A CLI must not retry forever like the service: give PostgreSQL half a minute, then say so.
    projector = Projector(
        log, dsn, name=args.name, batch_size=args.batch_size, retry=RetryPolicy(give_up_after=30.0)
    )
    failures: tuple[type[BaseException], ...] = (ProjectionError, EventLogError, *TRANSIENT_ERRORS)
    try:
        await projector.reset(keep_archive=args.keep_archive)
        target = await log.last_seq()
        position = await projector.catch_up(target)
    except failures as exc:
        print(f"rally projector rebuild: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        await projector.close()
        await log.close()
    report = {
        "projection": args.name,
        "seq": position,
        "events": projector.events_written,
        "batches": projector.batches_written,
        "seconds": round(time.monotonic() - started, 2),
        "quarantined": projector.quarantined_total,
    }
    emit(args, report, _rebuilt_line)
    if projector.quarantined_total:
        print(
            f"rally projector rebuild: {projector.quarantined_total} events refused by PostgreSQL were "
            "quarantined, not projected; `rally projector status` lists them",
            file=sys.stderr,
        )
    return 0


def _rebuilt_line(report: dict[str, Any]) -> str:
    return (
        f"rebuilt projection {report['projection']!r} to seq {report['seq']}: {report['events']} events in "
        f"{report['batches']} batches, {report['seconds']:.2f}s"
    )


def _status(args: argparse.Namespace) -> int:
    dsn = _require_dsn(args)
    if dsn is None:
        return 2
    try:
        report = asyncio.run(_status_async(args, dsn))
    except Exception as exc:  # any failure to reach either side is the answer the operator needs
        print(f"rally projector status: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if wants_json(args):
        print(json.dumps(report, sort_keys=True))
        return 0
    named = report.pop("quarantined")
    for key, value in report.items():
        print(f"{key:>17}: {value}")
    for event in named:
        print(f"  seq {event['seq']} on {event['subject']}: {event['type']}: {event['error']}")
    return 0


async def _status_async(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    import msgspec

    from rallypoint.eventlog import EventLog
    from rallypoint.projection import QUARANTINE_TABLE, SCHEMA, QuarantinedRow, connect, fetch_quarantined

    log = await EventLog.connect(
        args.nats_url, name="rally-projector-status", stream=args.stream, create=False
    )
    try:
        log_last = await log.last_seq()
    finally:
        await log.close()
    conn = await connect(dsn, application_name="rally-projector-status")
    try:
        # Read-only on purpose: status must not create the schema on a database it was pointed at by mistake.
        exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{SCHEMA}.projection_position")
        position = snapshot = jobs = nodes = events = None
        quarantined_total, quarantined = 0, list[QuarantinedRow]()
        if exists:
            position = await conn.fetchval(
                f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1", args.name
            )
            snapshot = await conn.fetchval(
                f"SELECT seq FROM {SCHEMA}.projection_snapshot WHERE name = $1", args.name
            )
            jobs = await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.jobs")
            nodes = await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.nodes")
            events = await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.events")
        # Created by a later migration than the rest: absent until a newer projector has connected.
        if exists and await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", QUARANTINE_TABLE):
            quarantined_total, quarantined = await fetch_quarantined(conn, args.name, args.limit)
    finally:
        await conn.close()
    pos = int(position or 0)
    return {
        "projection": args.name,
        "initialised": bool(exists),
        "position": pos,
        "log_last_seq": log_last,
        "lag": log_last - pos,
        "snapshot_seq": snapshot,
        "jobs": jobs,
        "nodes": nodes,
        "archived": events,
        "quarantined_total": quarantined_total,
        "quarantined": [msgspec.to_builtins(row) for row in quarantined],
    }
