"""`rally replay`: rebuild the cluster state from the log and print its hash (the audit's starting point)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import msgspec

from rallypoint.cli.clusterinfo import default_nats_url
from rallypoint.events import Event
from rallypoint.state import ClusterState


async def replay_state(nats_url: str, to_seq: int | None) -> dict[str, object]:
    from rallypoint.eventlog import EventLog

    log = await EventLog.connect(nats_url, name="rally-replay", create=False)
    try:
        state = ClusterState()
        async for rec in log.replay(to_seq=to_seq):
            state.apply(rec.seq, rec.event)
    finally:
        await log.close()
    return summarize(state)


def fold(history: list[tuple[int, Event]]) -> ClusterState:
    state = ClusterState()
    for seq, event in history:
        state.apply(seq, event)
    return state


def summarize(state: ClusterState) -> dict[str, object]:
    by_state: dict[str, int] = {}
    for job in state.jobs.values():
        by_state[job.state] = by_state.get(job.state, 0) + 1
    return {
        "seq": state.last_seq,
        "hash": state.hash(),
        "jobs": dict(sorted(by_state.items())),
        "nodes": len(state.nodes),
        "epoch": state.epoch,
        "ignored_binds": state.ignored_binds,
    }


async def read_history(nats_url: str, to_seq: int | None) -> list[tuple[int, Event]]:
    from rallypoint.eventlog import EventLog

    log = await EventLog.connect(nats_url, name="rally-audit", create=False)
    try:
        return [(rec.seq, rec.event) async for rec in log.replay(to_seq=to_seq)]
    finally:
        await log.close()


def _verify(args: argparse.Namespace) -> int:
    from rallypoint.audit import verify_decisions
    from rallypoint.scheduling import SchedulingPolicy, load_queue_config

    queues, classes = load_queue_config(args.queues)
    policy = SchedulingPolicy(args.policy, queues=queues, priority_classes=classes)
    report = verify_decisions(_history(args), policy)
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(f"seq {report.final_seq}  hash {report.final_hash}")
        print(
            f"policy {report.policy_version}: {report.decisions} decisions, {report.verified} recomputed "
            f"identically, {len(report.mismatches)} differ, {report.other_policy} made under another policy"
        )
        for m in report.mismatches:
            print(f"  seq {m.seq} {m.kind} {m.job_id}: recorded {m.recorded}, recomputed {m.recomputed}")
    return 0 if report.ok else 1


def export_history(history: list[tuple[int, Event]], path: str) -> int:
    """JSON Lines, one recorded event a line: {"seq", "event"} (the event as stored, tag included)."""
    with open(path, "wb") as out:
        for seq, event in history:
            out.write(msgspec.json.encode({"seq": seq, "event": event}) + b"\n")
    return len(history)


def load_history(path: str) -> list[tuple[int, Event]]:
    decoder = msgspec.json.Decoder(_ExportedRecord)
    with open(path, "rb") as source:
        return [(rec.seq, rec.event) for rec in (decoder.decode(line) for line in source if line.strip())]


class _ExportedRecord(msgspec.Struct, frozen=True):
    seq: int
    event: Event


def _history(args: argparse.Namespace) -> list[tuple[int, Event]]:
    if args.history:
        history = load_history(args.history)
        return [(seq, e) for seq, e in history if args.to is None or seq <= args.to]
    return asyncio.run(read_history(args.nats_url or default_nats_url(), args.to))


def _run(args: argparse.Namespace) -> int:
    from rallypoint.eventlog import EventLogError

    if args.to is not None and args.to < 1:
        print("error: --to: must be a sequence number >= 1", file=sys.stderr)
        return 2
    try:
        if args.verify_decisions:
            return _verify(args)
        if args.export:
            count = export_history(_history(args), args.export)
            print(f"exported {count} events to {args.export}")
            return 0
        summary = (
            summarize(fold(_history(args)))
            if args.history
            else asyncio.run(replay_state(args.nats_url or default_nats_url(), args.to))
        )
    except (EventLogError, OSError, TimeoutError) as exc:
        print(f"error: cannot replay the log: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        jobs = ", ".join(f"{k} {v}" for k, v in summary["jobs"].items()) or "none"  # type: ignore[attr-defined]
        print(f"seq {summary['seq']}  hash {summary['hash']}")
        print(f"nodes {summary['nodes']}  jobs: {jobs}  leader epoch {summary['epoch']}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="rebuild state from the event log and print its hash")
    parser.add_argument("--nats-url", default=None, help="NATS URL (default: the local cluster's, or env)")
    parser.add_argument("--to", type=int, default=None, metavar="SEQ", help="stop at this sequence")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--history",
        metavar="FILE",
        default=None,
        help="read an exported history (JSON Lines) instead of the live log",
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        default=None,
        help="write the events as JSON Lines (for audits elsewhere and recorded test histories)",
    )
    parser.add_argument(
        "--verify-decisions",
        action="store_true",
        help="recompute every recorded bind and preemption from the log; exit 1 if any differs",
    )
    parser.add_argument(
        "--policy", default="rallypoint", help="policy the scheduler ran (for --verify-decisions)"
    )
    parser.add_argument("--queues", default=None, help="queue configuration the scheduler ran with")
    parser.set_defaults(func=_run)
