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
scheduler's repair wait (``--repair-wait``), which the caller supplies as it supplies the queues.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

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
from rallypoint.scheduling import SchedulingPolicy, resized_placements
from rallypoint.scheduling.model_sync import ModelSync
from rallypoint.scheduling.repair import REPAIR_WAIT_S, repair_writes
from rallypoint.state import ClusterState, Decision, decision_refusal

from .writers import Trespass, WriterCheck

Recomputable = GangBound | PreemptionRequested | GangResized | JobPending
Repair = GangRepaired | JobRequeued
#: (seq, now) -> the decisions made in the cycle that folded the log to seq and ran at now.
Cycles = dict[int, dict[float, list[tuple[int, Recomputable]]]]
RepairCycles = dict[int, dict[float, list[tuple[int, Repair]]]]


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


class AuditReport(msgspec.Struct, kw_only=True):
    policy_version: str
    decisions: int = 0  # binds, preemption requests and resizes: the decisions a policy recomputes
    verified: int = 0
    # pending reasons that record their now (JobPending.now), recomputed like the decisions; a reason that
    # differs is a mismatch too
    reasons: int = 0
    reasons_verified: int = 0
    # repairs and requeues of interrupted gangs, recomputed with the scheduler's repair wait
    repairs: int = 0
    repairs_verified: int = 0
    repair_wait_s: float = REPAIR_WAIT_S
    other_policy: int = 0
    other_policy_seqs: list[int] = []
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
) -> AuditReport:
    """``records`` are (seq, event) in log order; every decision made under ``policy`` (and every repair,
    with the scheduler's ``repair_wait_s``) is recomputed and every fenced decision judged as the fold
    judged it."""
    history = list(records)
    report = AuditReport(
        policy_version=policy.version, allow_other_policies=allow_other_policies, repair_wait_s=repair_wait_s
    )
    cycles = _cycles(history, policy, report)
    repairs = _repair_cycles(history, policy, report)
    outcomes: dict[int, Mismatch | None] = {}
    state = ClusterState()
    writers = WriterCheck()
    _recompute_at(0, state, cycles, repairs, policy, repair_wait_s, outcomes)
    for seq, item in history:
        if isinstance(item, Decision):
            _judge(state, seq, item, report)
        if isinstance(item, Quarantined):
            writers.misplaced(seq, item)
            report.quarantined.append(seq)
        else:
            writers.before_apply(state, seq, item)
        state.apply_stored(seq, item)
        _note_lifecycle(state, seq, item, report)
        _recompute_at(seq, state, cycles, repairs, policy, repair_wait_s, outcomes)
    kinds = {seq: _kind(item) for seq, item in history}
    _tally(outcomes, report, kinds)
    report.trespasses = writers.trespasses
    report.final_seq = state.last_seq
    report.final_hash = state.hash()
    return report


def _cycles(
    history: list[tuple[int, Event | Quarantined]], policy: SchedulingPolicy, report: AuditReport
) -> Cycles:
    """Which snapshots are needed: decisions grouped by the (seq, now) of the cycle that made them."""
    cycles: Cycles = defaultdict(lambda: defaultdict(list))
    for seq, event in history:
        if isinstance(event, JobPending):
            if event.now is None:
                continue  # a reason logged before its now was recorded cannot be recomputed
            report.reasons += 1
        elif isinstance(event, Recomputable):
            report.decisions += 1
        if isinstance(event, Recomputable):
            if event.policy_version != policy.version:
                report.other_policy += 1
                report.other_policy_seqs.append(seq)
                continue
            now = event.now
            assert now is not None
            cycles[event.computed_at_seq][now].append((seq, event))
    return cycles


def _repair_cycles(
    history: list[tuple[int, Event | Quarantined]], policy: SchedulingPolicy, report: AuditReport
) -> RepairCycles:
    """Repairs and requeues grouped by the (seq, now) of the cycle that made them. A requeue names no
    policy (no policy rule decides it); a repair made under another policy version is not recomputed."""
    cycles: RepairCycles = defaultdict(lambda: defaultdict(list))
    for seq, event in history:
        if not isinstance(event, Repair):
            continue
        report.repairs += 1
        if isinstance(event, GangRepaired) and event.policy_version != policy.version:
            report.other_policy += 1
            report.other_policy_seqs.append(seq)
            continue
        cycles[event.computed_at_seq][event.now].append((seq, event))
    return cycles


def _recompute_at(
    seq: int,
    state: ClusterState,
    cycles: Cycles,
    repairs: RepairCycles,
    policy: SchedulingPolicy,
    repair_wait_s: float,
    outcomes: dict[int, Mismatch | None],
) -> None:
    """The decisions and repairs of the cycles that folded the log to ``seq`` (``state`` is there now)."""
    if seq in repairs:
        _check_repairs(state, repairs.pop(seq), repair_wait_s, outcomes)
    if seq in cycles:
        _check(state, cycles.pop(seq), policy, outcomes)


def _note_lifecycle(state: ClusterState, seq: int, item: Event | Quarantined, report: AuditReport) -> None:
    """What the audit names besides decisions: the attempts it saw start, the registrations held."""
    if isinstance(item, JobStarted):
        report.attempts.setdefault(item.job_id, []).append(item.attempt)
    elif isinstance(item, NodeRegistered):
        node = state.nodes.get(item.node_id)
        if node is not None and node.held_registration is item:
            report.held_registrations.setdefault(item.node_id, []).append(seq)


def _kind(item: Event | Quarantined) -> str:
    """How ``_tally`` counts a recomputed entry: a pending reason, a repair or a decision."""
    if isinstance(item, JobPending):
        return "reason"
    return "repair" if isinstance(item, Repair) else "decision"


def _judge(state: ClusterState, seq: int, event: Decision, report: AuditReport) -> None:
    """Would the fold apply ``event`` here? (Asked before it is applied, as the fold asks.)"""
    refusal = decision_refusal(state, event)
    if refusal is None:
        return
    refused = Refused(
        seq=seq, job_id=event.job_id, kind=type(event).__name__, refusal=refusal.kind, why=refusal.why
    )
    (report.overtaken if refusal.kind == "overtaken" else report.refused).append(refused)


def _tally(outcomes: dict[int, Mismatch | None], report: AuditReport, kinds: dict[int, str]) -> None:
    """A refused decision is reported as refused, not again as a mismatch (nor as verified). ``kinds``:
    each sequence's kind, so pending reasons and repairs are counted apart from the decisions."""
    refused = {r.seq for r in report.refused}
    for seq, mismatch in sorted(outcomes.items()):
        if seq in refused:
            continue
        if mismatch is not None:
            report.mismatches.append(mismatch)
        elif kinds[seq] == "reason":
            report.reasons_verified += 1
        elif kinds[seq] == "repair":
            report.repairs_verified += 1
        else:
            report.verified += 1


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
    by_now: dict[float, list[tuple[int, Recomputable]]],
    policy: SchedulingPolicy,
    outcomes: dict[int, Mismatch | None],
) -> None:
    for now, decisions in sorted(by_now.items()):
        recomputed = policy.decide(state, now)
        for seq, event in decisions:
            got, want = _outcome(state, event, recomputed)
            outcomes[seq] = _compared(seq, event, want, got)


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
    by_now: dict[float, list[tuple[int, Repair]]],
    repair_wait_s: float,
    outcomes: dict[int, Mismatch | None],
) -> None:
    """Each cycle's repairs recomputed together, as the leader computes them (replacements found for one
    gang are not free for the next), on a model built afresh from the fold."""
    for now, repairs in sorted(by_now.items()):
        model = ModelSync().sync(state)
        writes = repair_writes(
            state, model, now, epoch=0, policy_version="", at=now, repair_wait_s=repair_wait_s
        )
        recomputed: dict[str, Repair] = {}
        for write in writes:
            if isinstance(write.event, Repair):
                recomputed[write.event.job_id] = write.event
        for seq, event in repairs:
            got = _repair_outcome(recomputed.get(event.job_id))
            outcomes[seq] = _compared(seq, event, _repair_outcome(event), got)
