"""`rally replay`: rebuild the cluster state from the log and print its hash (the audit's starting point)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from rallypoint.cli.clusterinfo import default_nats_url


async def replay_state(nats_url: str, to_seq: int | None) -> dict[str, object]:
    from rallypoint.eventlog import EventLog
    from rallypoint.state import ClusterState

    log = await EventLog.connect(nats_url, name="rally-replay", create=False)
    try:
        state = ClusterState()
        async for rec in log.replay(to_seq=to_seq):
            state.apply(rec.seq, rec.event)
    finally:
        await log.close()
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


def _run(args: argparse.Namespace) -> int:
    from rallypoint.eventlog import EventLogError

    if args.to is not None and args.to < 1:
        print("error: --to: must be a sequence number >= 1", file=sys.stderr)
        return 2
    try:
        summary = asyncio.run(replay_state(args.nats_url or default_nats_url(), args.to))
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
    parser.set_defaults(func=_run)
