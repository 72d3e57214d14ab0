"""The replay gate: a history recorded from a real cluster must still fold, and every decision in it must
recompute identically with today's core. A change to the core or the fold that alters the past fails here.

If the change is intended, re-record with `python -m tests.replay.record_history` and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import fold, load_history
from rallypoint.events import GangBound, PreemptionRequested
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

DATA = Path(__file__).parent / "data"
HISTORY = load_history(str(DATA / "history.jsonl"))
EXPECTED = json.loads((DATA / "expected.json").read_text())


def test_the_history_folds_to_the_recorded_outcome() -> None:
    state = fold(HISTORY)
    assert state.last_seq == EXPECTED["summary"]["seq"]
    assert state.ignored_binds == 0 and state.orphans == 0
    outcome = {
        j.spec.name: {"state": j.state, "attempt": j.attempt, "preemptions": j.preemptions}
        for j in state.jobs.values()
    }
    assert outcome == EXPECTED["jobs"]


def test_the_history_exercises_what_the_gate_is_for() -> None:
    kinds = {type(event).__name__ for _, event in HISTORY}
    assert {
        "GangBound",
        "PreemptionRequested",
        "JobPreempted",
        "JobCancelled",
        "JobFailed",
        "LeaderEpochStarted",
    } <= kinds
    assert len({e.leader_id for _, e in HISTORY if type(e).__name__ == "LeaderEpochStarted"}) >= 2


def test_every_recorded_decision_recomputes_identically() -> None:
    report = verify_decisions(HISTORY, SchedulingPolicy("rallypoint"))
    decisions = sum(isinstance(e, GangBound | PreemptionRequested) for _, e in HISTORY)
    assert report.decisions == decisions > 0
    assert report.other_policy == 0
    assert report.mismatches == []
    assert report.verified == decisions


def test_a_snapshot_taken_midway_then_the_tail_gives_the_same_state() -> None:
    whole = fold(HISTORY)
    half = len(HISTORY) // 2
    restored = ClusterState.decode(fold(HISTORY[:half]).encode())
    for seq, event in HISTORY[half:]:
        restored.apply(seq, event)
    assert restored.hash() == whole.hash()
