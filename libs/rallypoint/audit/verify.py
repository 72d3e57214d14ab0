"""Recompute recorded decisions from the log and check them bit for bit, and check who made them.

Every ``GangBound``, ``PreemptionRequested``, ``GangResized`` and ``JobPending`` (those that record their
``now``) records the sequence its snapshot was folded up to (``computed_at_seq``), the ``now`` it used and
the policy version. Folding the log to that sequence and
running the same policy at the same ``now`` must give the same decision: that is what makes a decision
auditable. Pure: the caller supplies the recorded events, in log order. A message no fold of this version can
read (``Quarantined``) is skipped as every service skipped it, and listed in the report.

Every decision of a fenced writer (binds, repairs, requeues, pending reasons, preemption requests) is also
judged as the fold judges it (``state.decision_refusal``) at the moment it was appended: one that does not
carry its leader's current epoch (a deposed leader's, or forged), names an unknown job, or could never
have been right (GPUs that are not free, a gang that breaks the job's spec) is ``refused`` and fails the
audit. One ``overtaken`` (right when computed, but the job or a node changed before it was appended, a
race no fencing prevents) is listed and does not fail it: its recomputation still checks the decision.
A decision made under another policy version cannot be recomputed with this one: it fails the audit
unless the caller allows other policies (a log that spans a policy change).

Repairs (``GangRepaired``: replacement nodes swapped in, or an elastic gang shrunk to its healthy part)
and requeues (``JobRequeued``: no replacement in time) record their ``computed_at_seq`` and ``now`` too:
``repair_writes`` on the fold at that sequence, on a model built from it, at that ``now`` must give each
of them again. Whether a gang has waited long enough to be shrunk or requeued depends on the
scheduler's repair wait (``--repair-wait``).

Each decision is replayed under the settings its leader recorded for its epoch (``SchedulerSettings``:
policy, queues, repair wait; ``settings``); where none were recorded (an older log), under the policy and
repair wait the caller supplies. Settings the caller gives as ``Overrides`` replace recorded ones. Every
decision, pending reason and repair is counted once, so each kind's ``Tally`` adds up: total = verified +
differ + made under another policy + refused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TypeVar

import msgspec

from rallypoint.core.types import Decisions
from rallypoint.events import (
    Event,
    GangBound,
    GangRepaired,
    GangResized,
    JobPending,
    JobRequeued,
    JobStarted,
    NodeRegistered,
    PreemptionRequested,
    TaskPlacement,
)
from rallypoint.events.codec import Quarantined
from rallypoint.events.subjects import members
from rallypoint.scheduling import SchedulingPolicy, resized_placements
from rallypoint.scheduling.model_sync import ModelSync
from rallypoint.scheduling.repair import REPAIR_WAIT_S, repair_writes
from rallypoint.state import ClusterState, Decision, decision_refusal

from .settings import Overrides, SettingsSpan, Span, SpanIndex, fallback_span
from .writers import Trespass, WriterCheck

Recomputable = GangBound | PreemptionRequested | GangResized | JobPending
Repair = GangRepaired | JobRequeued
_History = list[tuple[int, Event | Quarantined]]
#: An entry of the history: its sequence and its place among the events stored there (0 but for the
#: binds of a ``GangsBound``, each an entry of its own).
Key = tuple[int, int]
_Entry = TypeVar("_Entry", Recomputable, Repair)
#: seq -> (now, the settings' seq) -> (the settings, the entries made in the cycle that folded the log to
#: seq and ran at now under them).
Grouped = dict[int, dict[tuple[float, int], tuple[Span, list[tuple[Key, _Entry]]]]]
Cycles = Grouped[Recomputable]
RepairCycles = Grouped[Repair]
#: The kinds of recomputed entries, as ``AuditReport.tallies`` names them.
KINDS = ("decisions", "reasons", "repairs")


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    job_id: str
    kind: str
    recorded: str
    recomputed: str


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """A decision the fold did not apply: ``refusal`` is ``epoch``, ``unknown-job``, ``invalid`` or
    ``overtaken`` (see ``state.Refusal``)."""

    seq: int
    job_id: str
    kind: str
    refusal: str
    why: str


class Tally(msgspec.Struct, kw_only=True):
    """One kind of recomputed entry, each counted once: total = verified + differ + other_policy +
    refused (refused by the fold: it changed nothing, whatever its policy)."""

    total: int = 0
    verified: int = 0
    differ: int = 0
    other_policy: int = 0
    refused: int = 0


class AuditReport(msgspec.Struct, kw_only=True):
    policy_version: str  # the fallback's: where the log recorded no settings
    decisions: int = 0  # binds, preemption requests and resizes: the decisions a policy recomputes
    verified: int = 0
    # pending reasons that record their now (JobPending.now), recomputed like the decisions; a reason that
    # differs is a mismatch too
    reasons: int = 0
    reasons_verified: int = 0
    # repairs and requeues of interrupted gangs, recomputed with the scheduler's repair wait
    repairs: int = 0
    repairs_verified: int = 0
    repair_wait_s: float = REPAIR_WAIT_S  # the fallback's
    other_policy: int = 0  # of every kind
    other_policy_seqs: list[int] = []
    # "decisions", "reasons", "repairs" -> how each kind's entries came out; each adds up to its total
    tallies: dict[str, Tally] = {}
    # the settings each span of decisions was replayed under: the fallback, then those recorded
    settings: list[SettingsSpan] = []
    allow_other_policies: bool = False
    mismatches: list[Mismatch] = []
    refused: list[Refused] = []  # not their leader's, unknown job or invalid: the audit fails
    overtaken: list[Refused] = []  # listed only
    final_seq: int = 0
    final_hash: str = ""
    quarantined: list[int] = []  # sequences of the messages the fold skipped
    # events their writer had no right to, or its rules never give (``writers``): the audit fails
    trespasses: list[Trespass] = []
    # node -> the sequences of its re-registrations that changed its hardware, held for an operator
    held_registrations: dict[str, list[int]] = {}
    # job -> the attempts the log started (JobStarted), in order
    attempts: dict[str, list[int]] = {}

    @property
    def ok(self) -> bool:
        unverifiable = self.other_policy and not self.allow_other_policies
        return not self.mismatches and not self.refused and not unverifiable and not self.trespasses


def verify_decisions(
    records: Iterable[tuple[int, Event | Quarantined]],
    policy: SchedulingPolicy,
    *,
    allow_other_policies: bool = False,
    repair_wait_s: float = REPAIR_WAIT_S,
    overrides: Overrides | None = None,
) -> AuditReport:
    """``records`` are (seq, event) in log order; every decision made under the settings its leader
    recorded (``policy`` and ``repair_wait_s`` where none were; ``overrides`` replace recorded ones) is
    recomputed and every fenced decision judged as the fold judged it."""
    history = list(records)
    report = AuditReport(
        policy_version=policy.version, allow_other_policies=allow_other_policies, repair_wait_s=repair_wait_s
    )
    given = overrides or Overrides()
    spans = SpanIndex(history, fallback_span(policy, repair_wait_s, given), given)
    kinds: dict[Key, str] = {}
    other: set[Key] = set()
    cycles = _cycles(history, spans, kinds, other)
    repairs = _repair_cycles(history, spans, kinds, other)
    outcomes: dict[Key, Mismatch | None] = {}
    refused: set[Key] = set()
    state = ClusterState()
    writers = WriterCheck()
    _recompute_at(0, state, cycles, repairs, outcomes)
    for seq, stored in history:
        if isinstance(stored, Quarantined):
            writers.misplaced(seq, stored)
            report.quarantined.append(seq)
        else:
            writers.before_apply(state, seq, stored)
        for key, item in _entries(seq, stored):
            if isinstance(item, Decision) and _judge(state, seq, item, report):
                refused.add(key)
            state.apply_stored(seq, item)
            _note_lifecycle(state, seq, item, report)
        _recompute_at(seq, state, cycles, repairs, outcomes)
    _not_recomputed(cycles, repairs, outcomes)
    _tally(outcomes, report, kinds, refused, other)
    report.settings = spans.spans()
    report.trespasses = writers.trespasses
    report.final_seq = state.last_seq
    report.final_hash = state.hash()
    return report


def _entries(seq: int, stored: Event | Quarantined) -> list[tuple[Key, Event | Quarantined]]:
    """What the log stores at ``seq``, entry by entry: a ``GangsBound``'s binds, or the one event."""
    return [((seq, index), entry) for index, entry in enumerate(members(stored))]


def _all_entries(history: _History) -> list[tuple[Key, Event | Quarantined]]:
    return [entry for seq, stored in history for entry in _entries(seq, stored)]


def _cycles(history: _History, spans: SpanIndex, kinds: dict[Key, str], other: set[Key]) -> Cycles:
    """Which snapshots are needed: decisions and reasons grouped by the cycle that made them (its seq, its
    now, its settings). One made under another policy than its settings' is counted, not recomputed."""
    cycles: Cycles = defaultdict(dict)
    for key, event in _all_entries(history):
        if not isinstance(event, Recomputable):
            continue
        if isinstance(event, JobPending) and event.now is None:
            continue  # a reason logged before its now was recorded cannot be recomputed
        kinds[key] = "reasons" if isinstance(event, JobPending) else "decisions"
        span = spans.of(event)
        if event.policy_version != span.policy.version:
            other.add(key)
            continue
        assert event.now is not None
        _group(cycles, event.computed_at_seq, event.now, span, (key, event))
    return cycles


def _repair_cycles(
    history: _History, spans: SpanIndex, kinds: dict[Key, str], other: set[Key]
) -> RepairCycles:
    """Repairs and requeues grouped by the cycle that made them. A requeue names no policy (no policy
    rule decides it); a repair made under another policy version is not recomputed."""
    cycles: RepairCycles = defaultdict(dict)
    for key, event in _all_entries(history):
        if not isinstance(event, Repair):
            continue
        kinds[key] = "repairs"
        span = spans.of(event)
        if isinstance(event, GangRepaired) and event.policy_version != span.policy.version:
            other.add(key)
            continue
        _group(cycles, event.computed_at_seq, event.now, span, (key, event))
    return cycles


def _group(cycles: Grouped[_Entry], seq: int, now: float, span: Span, entry: tuple[Key, _Entry]) -> None:
    _, entries = cycles[seq].setdefault((now, span.report.seq), (span, []))
    entries.append(entry)


def _recompute_at(
    seq: int,
    state: ClusterState,
    cycles: Cycles,
    repairs: RepairCycles,
    outcomes: dict[Key, Mismatch | None],
) -> None:
    """The decisions and repairs of the cycles that folded the log to ``seq`` (``state`` is there now)."""
    if seq in repairs:
        _check_repairs(state, repairs.pop(seq), outcomes)
    if seq in cycles:
        _check(state, cycles.pop(seq), outcomes)


def _not_recomputed(cycles: Cycles, repairs: RepairCycles, outcomes: dict[Key, Mismatch | None]) -> None:
    """Entries whose snapshot position the history never reached (one past their own, or missing): they
    could not be recomputed, which is a difference, so every entry is counted."""
    for pending in (cycles, repairs):
        for at_seq, groups in pending.items():
            for _, entries in groups.values():
                for key, event in entries:
                    why = f"no snapshot: the history has no seq {at_seq}"
                    outcomes[key] = _compared(key[0], event, "recorded", why)


def _note_lifecycle(state: ClusterState, seq: int, item: Event | Quarantined, report: AuditReport) -> None:
    """What the audit names besides decisions: the attempts it saw start, the registrations held."""
    if isinstance(item, JobStarted):
        report.attempts.setdefault(item.job_id, []).append(item.attempt)
    elif isinstance(item, NodeRegistered):
        node = state.nodes.get(item.node_id)
        if node is not None and node.held_registration is item:
            report.held_registrations.setdefault(item.node_id, []).append(seq)


def _judge(state: ClusterState, seq: int, event: Decision, report: AuditReport) -> bool:
    """Would the fold apply ``event`` here? (Asked before it is applied, as the fold asks.) True when it
    is refused (beyond being overtaken): the audit fails."""
    refusal = decision_refusal(state, event)
    if refusal is None:
        return False
    refused = Refused(
        seq=seq, job_id=event.job_id, kind=type(event).__name__, refusal=refusal.kind, why=refusal.why
    )
    overtaken = refusal.kind == "overtaken"
    (report.overtaken if overtaken else report.refused).append(refused)
    return not overtaken


def _tally(
    outcomes: dict[Key, Mismatch | None],
    report: AuditReport,
    kinds: dict[Key, str],
    refused: set[Key],
    other: set[Key],
) -> None:
    """Every entry counted once, in its kind's tally: a refused one as refused (not again as made under
    another policy, a mismatch or verified), then another policy's, then its recomputation's outcome.
    ``kinds``: each counted entry's kind. The report's older totals are read off the tallies."""
    tallies = {kind: Tally() for kind in KINDS}
    for key, kind in sorted(kinds.items()):
        tally = tallies[kind]
        tally.total += 1
        mismatch = outcomes.get(key)
        if key in refused:
            tally.refused += 1
        elif key in other:
            tally.other_policy += 1
        elif mismatch is not None:
            tally.differ += 1
            report.mismatches.append(mismatch)
        else:
            tally.verified += 1
    unrefused = other - refused
    report.other_policy_seqs = sorted({seq for seq, _ in unrefused})
    report.other_policy = len(unrefused)
    report.tallies = tallies
    report.decisions, report.verified = tallies["decisions"].total, tallies["decisions"].verified
    report.reasons, report.reasons_verified = tallies["reasons"].total, tallies["reasons"].verified
    report.repairs, report.repairs_verified = tallies["repairs"].total, tallies["repairs"].verified


def _encoded(placements: tuple[TaskPlacement, ...]) -> str:
    return msgspec.json.encode(sorted(placements, key=lambda p: p.task)).decode()


def _outcome(state: ClusterState, event: Recomputable, recomputed: Decisions) -> tuple[str, str]:
    """(recomputed, recorded), comparable as strings: placements for a bind or a resize (the whole new
    gang, built from the job's placements as the bridge builds it), "preempted" for a preemption request."""
    if isinstance(event, GangBound):
        bind = next((b for b in recomputed.binds if b.job_id == event.job_id), None)
        return ("not bound" if bind is None else _encoded(bind.placements)), _encoded(event.placements)
    if isinstance(event, GangResized):
        resize = next((r for r in recomputed.resizes if r.job_id == event.job_id), None)
        job = state.jobs.get(event.job_id)
        if resize is None or job is None:
            return "not resized", _encoded(event.placements)
        return _encoded(resized_placements(job.placements, resize)), _encoded(event.placements)
    if isinstance(event, JobPending):
        return _pending_outcome(event, recomputed)
    victims = {(p.victim_id, p.for_job, p.reason) for p in recomputed.preemptions}
    got = "preempted" if (event.job_id, event.for_job, event.reason) in victims else "not preempted"
    return got, "preempted"


def _pending_outcome(event: JobPending, recomputed: Decisions) -> tuple[str, str]:
    """A pending reason is its code, position and message, exactly as the core gave them."""
    reason = next((r for r in recomputed.pending if r.job_id == event.job_id), None)
    want = f"{event.code} #{event.position}: {event.message}"
    return ("no reason" if reason is None else f"{reason.code} #{reason.position}: {reason.message}"), want


def _check(
    state: ClusterState,
    groups: dict[tuple[float, int], tuple[Span, list[tuple[Key, Recomputable]]]],
    outcomes: dict[Key, Mismatch | None],
) -> None:
    for (now, _), (span, decisions) in sorted(groups.items()):
        recomputed = span.policy.decide(state, now)
        for key, event in decisions:
            got, want = _outcome(state, event, recomputed)
            outcomes[key] = _compared(key[0], event, want, got)


def _compared(seq: int, event: Recomputable | Repair, recorded: str, recomputed: str) -> Mismatch | None:
    """None when the recomputation gave the recorded decision again, else the mismatch."""
    if recorded == recomputed:
        return None
    return Mismatch(
        seq=seq, job_id=event.job_id, kind=type(event).__name__, recorded=recorded, recomputed=recomputed
    )


def _repair_outcome(event: Repair | None) -> str:
    """A repair as comparable text: the whole new gang, the swaps and whether it shrank; a requeue's
    reason (which names the repair wait it waited out)."""
    if event is None:
        return "no repair"
    if isinstance(event, JobRequeued):
        return f"requeued: {event.reason}"
    swaps = msgspec.json.encode(event.swaps).decode()
    return f"repaired {_encoded(event.placements)} swaps {swaps}" + (" shrunk" if event.shrunk else "")


def _check_repairs(
    state: ClusterState,
    groups: dict[tuple[float, int], tuple[Span, list[tuple[Key, Repair]]]],
    outcomes: dict[Key, Mismatch | None],
) -> None:
    """Each cycle's repairs recomputed together, as the leader computes them (replacements found for one
    gang are not free for the next), on a model built afresh from the fold, with its settings' wait."""
    for (now, _), (span, repairs) in sorted(groups.items()):
        model = ModelSync().sync(state)
        writes = repair_writes(
            state, model, now, epoch=0, policy_version="", at=now, repair_wait_s=span.repair_wait_s
        )
        recomputed: dict[str, Repair] = {}
        for write in writes:
            if isinstance(write.event, Repair):
                recomputed[write.event.job_id] = write.event
        for key, event in repairs:
            got = _repair_outcome(recomputed.get(event.job_id))
            outcomes[key] = _compared(key[0], event, _repair_outcome(event), got)
