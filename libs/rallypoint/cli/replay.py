"""`rally replay`: rebuild the cluster state from the log and print its hash (the audit's starting point).

A message the fold cannot read is skipped exactly as every service skips it (``ClusterState.apply_stored``)
and listed: the summary and the audit print the quarantined sequences, an export writes a quarantine
record in its place, and a history read back quarantines any event this version does not know.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

import msgspec

from rallypoint.cli.clusterinfo import default_nats_url
from rallypoint.cli.output import add_output_args, wants_json
from rallypoint.events import Event
from rallypoint.events.codec import Quarantined, decode_stored
from rallypoint.state import ClusterState

if TYPE_CHECKING:
    from rallypoint.audit import AuditReport, Overrides, SettingsSpan
    from rallypoint.scheduling import SchedulingPolicy

#: (seq, what the log stores there) in log order: an event, or a message this version cannot read.
History = list[tuple[int, Event | Quarantined]]


async def replay_state(nats_url: str, to_seq: int | None) -> dict[str, object]:
    from rallypoint.eventlog import EventLog, stored

    log = await EventLog.connect(nats_url, name="rally-replay", create=False)
    try:
        state = ClusterState()
        async for rec in log.replay(to_seq=to_seq, quarantine=True):
            state.apply_stored(rec.seq, stored(rec))
    finally:
        await log.close()
    return summarize(state)


def fold(history: History) -> ClusterState:
    state = ClusterState()
    for seq, item in history:
        state.apply_stored(seq, item)
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
        "stale_decisions": state.stale_decisions,
        "quarantined_total": state.quarantine.total,
        "quarantined": msgspec.to_builtins(state.quarantine.records),
    }


def quarantine_lines(summary: dict[str, object]) -> list[str]:
    """What a human reads about the messages the fold skipped (nothing when there are none)."""
    total = summary["quarantined_total"]
    records = msgspec.convert(summary["quarantined"], list[Quarantined])
    if not isinstance(total, int) or not total:
        return []
    lines = [f"quarantined {total} message(s) no fold of this version can read, skipped by every service:"]
    lines += [f"  {r.describe()}" for r in records]
    if total > len(records):
        lines.append(f"  ... and {total - len(records)} more")
    return lines


async def read_history(nats_url: str, to_seq: int | None) -> History:
    from rallypoint.eventlog import EventLog, stored

    log = await EventLog.connect(nats_url, name="rally-audit", create=False)
    try:
        return [(rec.seq, stored(rec)) async for rec in log.replay(to_seq=to_seq, quarantine=True)]
    finally:
        await log.close()


def _seconds(text: str) -> float:
    """A number of seconds, zero or more (argparse names the option in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text!r}")
    return value


def _verify(args: argparse.Namespace) -> int:
    from rallypoint.audit import verify_decisions
    from rallypoint.scheduling.repair import REPAIR_WAIT_S

    try:
        overrides = _overrides(args)
        fallback = _fallback_policy(overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = verify_decisions(
        _history(args),
        fallback,
        allow_other_policies=args.allow_other_policies,
        repair_wait_s=REPAIR_WAIT_S if args.repair_wait is None else args.repair_wait,
        overrides=overrides,
    )
    if wants_json(args):
        print(msgspec.json.encode(report).decode())
    else:
        for line in audit_lines(report):
            print(line)
    return 0 if report.ok else 1


def _overrides(args: argparse.Namespace) -> Overrides:
    """The settings given on the command line, each replacing what the scheduler recorded (ValueError
    naming the flag when one cannot be used)."""
    from rallypoint.audit import Overrides
    from rallypoint.core import policy_names
    from rallypoint.scheduling import load_queue_config
    from rallypoint.scheduling.queues import QueuesError

    if args.policy is not None and args.policy not in policy_names():
        raise ValueError(f"--policy: unknown policy {args.policy!r}; known: {', '.join(policy_names())}")
    if args.queues is None:
        return Overrides(policy=args.policy, repair_wait_s=args.repair_wait)
    try:
        queues, classes = load_queue_config(args.queues)
    except QueuesError as exc:
        raise ValueError(f"--queues: {exc}") from None
    return Overrides(
        policy=args.policy,
        queue_file=args.queues,
        queues=queues,
        priority_classes=classes,
        repair_wait_s=args.repair_wait,
    )


def _fallback_policy(overrides: Overrides) -> SchedulingPolicy:
    """What decisions of an epoch that recorded no settings are replayed under: the flags, else the
    scheduler's defaults."""
    from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES
    from rallypoint.scheduling import SchedulingPolicy

    classes = overrides.priority_classes
    return SchedulingPolicy(
        overrides.policy or "rallypoint",
        queues=overrides.queues or (),
        priority_classes=DEFAULT_PRIORITY_CLASSES if classes is None else classes,
    )


def audit_lines(report: AuditReport) -> list[str]:
    """What a human reads of an audit: the settings it replayed under, totals, then every decision that
    fails it, then what is listed only."""
    lines = [f"seq {report.final_seq}  hash {report.final_hash}", *settings_lines(report)]
    lines += tally_lines(report)
    lines += attempt_lines(report)
    lines.append(f"writers: {len(report.trespasses)} event(s) not their writer's")
    lines += [
        f"  seq {m.seq} {m.kind} {m.job_id}: recorded {m.recorded}, recomputed {m.recomputed}"
        for m in report.mismatches
    ]
    if report.refused:
        lines.append(
            "refused (not their leader's current epoch, unknown job or invalid; they changed nothing):"
        )
        lines += [f"  seq {r.seq} {r.kind} {r.job_id}: {r.refusal}: {r.why}" for r in report.refused]
    if report.other_policy:
        allowed = "accepted" if report.allow_other_policies else "unverifiable here (--allow-other-policies)"
        lines.append(f"made under another policy, {allowed}: seq {_seq_list(report.other_policy_seqs)}")
    if report.overtaken:
        lines.append(
            "overtaken (the job or a node changed between the decision and its append; not applied):"
        )
        lines += [f"  seq {r.seq} {r.kind} {r.job_id}: {r.why}" for r in report.overtaken]
    if report.quarantined:
        lines.append(
            f"quarantined (skipped by the fold, as by every service): seq {_seq_list(report.quarantined)}"
        )
    if report.trespasses:
        lines.append("not their writer's (forged, or against its rules; the fold applied none of them):")
        lines += [f"  {t.describe()}" for t in report.trespasses]
    for node_id, seqs in sorted(report.held_registrations.items()):
        lines.append(
            f"held for an operator: node {node_id} re-registered with other hardware at seq {_seq_list(seqs)}"
        )
    return lines


def settings_lines(report: AuditReport) -> list[str]:
    """The settings each span of decisions was replayed under: recorded by the scheduler, or (where it
    recorded none) the defaults and flags; a flag that replaced a recorded value says so. Epochs that
    recorded the same settings (a scheduler restarted as it was) share one line."""
    lines = []
    for spans in _alike(report.settings):
        span = spans[0]
        queues = f"queues {span.queue_file}" if span.queue_file else "no queue file"
        wait = f"repair wait {span.repair_wait_s:g} s"
        judged = sum(s.decisions for s in spans)
        lines.append(
            f"settings {_recorded_where(spans)}: policy {span.policy_version}, {queues}, {wait}; "
            f"{judged} decisions, reasons and repairs judged under them"
        )
        if span.seq and span.overridden:
            lines.append(f"  {', '.join(span.overridden)} given: replaces what the scheduler recorded")
        if span.recorded_policy_version:
            lines.append(
                f"  the scheduler recorded policy {span.recorded_policy_version}, which this version cannot "
                "rebuild: its decisions count as made under another policy"
            )
    return lines


def _alike(spans: list[SettingsSpan]) -> list[list[SettingsSpan]]:
    """``spans`` grouped by what they replay under, in order of first appearance (the fallback alone)."""
    groups: dict[tuple[object, ...], list[SettingsSpan]] = {}
    for span in spans:
        key = (
            span.seq == 0,
            span.policy_version,
            span.queue_file,
            span.repair_wait_s,
            tuple(span.overridden),
            span.recorded_policy_version,
        )
        groups.setdefault(key, []).append(span)
    return list(groups.values())


def _recorded_where(spans: list[SettingsSpan], *, most: int = 8) -> str:
    if not spans[0].seq:
        return "where the scheduler recorded none (the defaults and flags)"
    if len(spans) == 1:
        return f"recorded by the scheduler at seq {spans[0].seq} (epoch {spans[0].epoch})"
    epochs = _seq_list([s.epoch for s in spans[:most]]) + (" ..." if len(spans) > most else "")
    return f"recorded by the scheduler in {len(spans)} epochs ({epochs}), first at seq {spans[0].seq}"


def tally_lines(report: AuditReport) -> list[str]:
    """Each kind's count, every entry counted once, so the parts add up to it. Reasons and repairs only
    when the log has some."""
    names = {
        "decisions": "decisions (binds, preemptions, resizes)",
        "reasons": "pending reasons",
        "repairs": "repairs and requeues",
    }
    lines = []
    for kind, tally in report.tallies.items():
        if kind != "decisions" and not tally.total:
            continue
        lines.append(
            f"{names[kind]}: {tally.total}, each counted once: {tally.verified} recomputed identically, "
            f"{tally.differ} differ, {tally.other_policy} made under another policy, {tally.refused} refused "
            "by the fold"
        )
    return lines


def attempt_lines(report: AuditReport, *, most: int = 20) -> list[str]:
    """The attempts the audit saw start, a job a line (the first ``most`` jobs)."""
    jobs = sorted(report.attempts.items())
    lines = [f"attempts: {sum(len(a) for _, a in jobs)} started, of {len(jobs)} jobs"]
    lines += [f"  {job_id} attempt {_seq_list(attempts)}" for job_id, attempts in jobs[:most]]
    if len(jobs) > most:
        lines.append(f"  ... and {len(jobs) - most} more jobs (-o json lists every one)")
    return lines


def _seq_list(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs))


def export_history(history: History, path: str) -> int:
    """JSON Lines, one stored message a line, in log order: {"seq", "event"} (the event as stored, tag
    included), or {"seq", "quarantined"} (the quarantine record) for a message this version cannot read."""
    with open(path, "wb") as out:
        for seq, item in history:
            key = "quarantined" if isinstance(item, Quarantined) else "event"
            out.write(msgspec.json.encode({"seq": seq, key: item}) + b"\n")
    return len(history)


def load_history(path: str) -> History:
    """An exported history; an event this version cannot read (a newer export) comes back quarantined."""
    decoder = msgspec.json.Decoder(_ExportedRecord)
    with open(path, "rb") as source:
        return [_exported_item(decoder.decode(line)) for line in source if line.strip()]


class _ExportedRecord(msgspec.Struct, frozen=True):
    seq: int
    event: msgspec.Raw = msgspec.Raw()  # decoded afterwards, so a line this version cannot read is kept
    quarantined: Quarantined | None = None


def _exported_item(rec: _ExportedRecord) -> tuple[int, Event | Quarantined]:
    if rec.quarantined is not None:
        return rec.seq, rec.quarantined
    return rec.seq, decode_stored(bytes(rec.event), seq=rec.seq, subject="")


def _history(args: argparse.Namespace) -> History:
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
            history = _history(args)
            count = export_history(history, args.export)
            print(f"exported {count} events to {args.export}")
            skipped = [seq for seq, item in history if isinstance(item, Quarantined)]
            if skipped:
                print(f"quarantine records written for seq {_seq_list(skipped)}")
            return 0
        summary = (
            summarize(fold(_history(args)))
            if args.history
            else asyncio.run(replay_state(args.nats_url or default_nats_url(), args.to))
        )
    except (EventLogError, OSError, TimeoutError) as exc:
        print(f"error: cannot replay the log: {exc}", file=sys.stderr)
        return 1
    if wants_json(args):
        print(json.dumps(summary, sort_keys=True))
    else:
        jobs = ", ".join(f"{k} {v}" for k, v in summary["jobs"].items()) or "none"  # type: ignore[attr-defined]
        print(f"seq {summary['seq']}  hash {summary['hash']}")
        print(f"nodes {summary['nodes']}  jobs: {jobs}  leader epoch {summary['epoch']}")
        for line in quarantine_lines(summary):
            print(line)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="rebuild state from the event log and print its hash")
    parser.add_argument("--nats-url", default=None, help="NATS URL (default: the local cluster's, or env)")
    parser.add_argument("--to", type=int, default=None, metavar="SEQ", help="stop at this sequence")
    add_output_args(parser)
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
        help="recompute every recorded bind, preemption, resize, pending reason and repair from the log and "
        "judge every fenced decision "
        "as the fold does; exit 1 if any differs, was refused (not its leader's epoch, invalid) or was "
        "made under another policy",
    )
    parser.add_argument(
        "--allow-other-policies",
        action="store_true",
        help="with --verify-decisions: decisions made under another policy version are listed, not a failure",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="with --verify-decisions: the policy to replay under (default: the one the scheduler recorded, "
        "else rallypoint)",
    )
    parser.add_argument(
        "--queues",
        default=None,
        metavar="FILE",
        help="with --verify-decisions: the queue configuration to replay under (default: the one the "
        "scheduler recorded, else none)",
    )
    parser.add_argument(
        "--repair-wait",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="with --verify-decisions: how long an interrupted gang waited for replacement nodes before it "
        "was shrunk or requeued (default: the scheduler's recorded --repair-wait, else its default)",
    )
    parser.set_defaults(func=_run)
