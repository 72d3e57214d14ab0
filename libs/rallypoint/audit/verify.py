"""Recompute recorded decisions from the log and check them bit for bit.

Every ``GangBound`` and ``PreemptionRequested`` records the sequence its snapshot was folded up to
(``computed_at_seq``), the ``now`` it used and the policy version. Folding the log to that sequence and
running the same policy at the same ``now`` must give the same decision: that is what makes a
decision auditable. Pure: the caller supplies the recorded events, in log order. A message no fold of
this version can read (``Quarantined``) is skipped as every service skipped it, and listed in the report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import msgspec

from rallypoint.events import Event, GangBound, PreemptionRequested
from rallypoint.events.codec import Quarantined
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

Decision = GangBound | PreemptionRequested


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    job_id: str
    kind: str
    recorded: str
    recomputed: str


class AuditReport(msgspec.Struct, kw_only=True):
    policy_version: str
    decisions: int = 0
    verified: int = 0
    other_policy: int = 0
    mismatches: list[Mismatch] = []
    final_seq: int = 0
    final_hash: str = ""
    quarantined: list[int] = []  # sequences of the messages the fold skipped

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _placements(event: GangBound) -> str:
    return msgspec.json.encode(sorted(event.placements, key=lambda p: p.task)).decode()


def verify_decisions(
    records: Iterable[tuple[int, Event | Quarantined]], policy: SchedulingPolicy
) -> AuditReport:
    """``records`` are (seq, event) in log order; every decision made under ``policy`` is recomputed."""
    history = list(records)
    # Which snapshots are needed: decisions grouped by the (seq, now) of the cycle that made them.
    cycles: dict[int, dict[float, list[tuple[int, Decision]]]] = defaultdict(lambda: defaultdict(list))
    report = AuditReport(policy_version=policy.version)
    for seq, event in history:
        if isinstance(event, GangBound | PreemptionRequested):
            report.decisions += 1
            if event.policy_version != policy.version:
                report.other_policy += 1
                continue
            cycles[event.computed_at_seq][event.now].append((seq, event))

    state = ClusterState()
    if 0 in cycles:
        _check(state, cycles.pop(0), policy, report)
    for seq, event in history:
        state.apply_stored(seq, event)
        if isinstance(event, Quarantined):
            report.quarantined.append(seq)
        if seq in cycles:
            _check(state, cycles.pop(seq), policy, report)
    report.final_seq = state.last_seq
    report.final_hash = state.hash()
    return report


def _check(
    state: ClusterState,
    by_now: dict[float, list[tuple[int, Decision]]],
    policy: SchedulingPolicy,
    report: AuditReport,
) -> None:
    for now, decisions in sorted(by_now.items()):
        recomputed = policy.decide(state, now)
        binds = {b.job_id: b for b in recomputed.binds}
        victims = {(p.victim_id, p.for_job, p.reason) for p in recomputed.preemptions}
        for seq, event in decisions:
            if isinstance(event, GangBound):
                bind = binds.get(event.job_id)
                got = (
                    "not bound"
                    if bind is None
                    else msgspec.json.encode(sorted(bind.placements, key=lambda p: p.task)).decode()
                )
                want = _placements(event)
                kind = "GangBound"
            else:
                got = (
                    "preempted" if (event.job_id, event.for_job, event.reason) in victims else "not preempted"
                )
                want = "preempted"
                kind = "PreemptionRequested"
            if got == want:
                report.verified += 1
            else:
                report.mismatches.append(
                    Mismatch(seq=seq, job_id=event.job_id, kind=kind, recorded=want, recomputed=got)
                )
