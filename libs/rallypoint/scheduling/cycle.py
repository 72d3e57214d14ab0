"""The steps of one scheduling cycle, shared by the live leader and the simulator's twin of it.

A cycle writes in two steps with a fold in between: what must be folded before deciding (repairs of
interrupted gangs, and the admissions when one of them is a rejection: a rejected job waits for nothing),
then the decisions on that fold followed by the admissions that did not need to go first (a queue
assignment changes nothing the core reads, so it rides after the binds). The leader appends each step's
writes through its fenced writer and waits for its fold between them; the twin appends them to its fold
at once. Both call these two functions, so the order of the steps cannot drift apart between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rallypoint.core.types import Decisions
from rallypoint.events import JobRejected
from rallypoint.state import ClusterState

from .adapter import cycle_needed
from .bridge import admission_writes, decision_writes
from .model_sync import Changed
from .policy import SchedulingPolicy
from .writes import Write


class ChangeFeed(Protocol):
    """What the fold touched since the last take (the follower's ``ChangeSet``, the twin's own)."""

    def take(self) -> Changed: ...


def writes_before_deciding(
    state: ClusterState, now: float, repairs: Sequence[Write]
) -> tuple[list[Write], list[Write]]:
    """(what to write and fold before deciding, the admissions that ride after the decisions)."""
    admissions = admission_writes(state, at=now)
    if repairs or any(isinstance(w.event, JobRejected) for w in admissions):
        return [*repairs, *admissions], []
    return [], admissions


def decide(
    policy: SchedulingPolicy,
    state: ClusterState,
    now: float,
    changes: ChangeFeed,
    *,
    epoch: int,
    admissions: Sequence[Write],
    reasons: bool = True,
) -> tuple[Decisions, list[Write]] | None:
    """The cycle's decisions on ``state`` and their writes (the decisions', then ``admissions``); None
    when no cycle is needed. ``reasons=False``: no pending reasons among them (``decision_writes``). The
    changes are taken only when the model is synced: a skipped cycle leaves them for the next one."""
    if not cycle_needed(state):
        return None
    decisions = policy.decide_live(state, now, changed=changes.take())
    writes = decision_writes(
        decisions, state, epoch=epoch, policy_version=policy.version, at=now, reasons=reasons
    )
    return decisions, [*writes, *waiting_admissions(admissions, decisions)]


def waiting_admissions(admissions: Sequence[Write], decisions: Decisions) -> list[Write]:
    """The admissions of the jobs these decisions do not bind. A bind admits its job (the fold sets its
    queue), so a job bound by the cycle that first sees it needs no ``JobQueued``: one event fewer for each
    such job, in every fold of the log and every consumer of the stream (issue 34's CPU per job)."""
    if not decisions.binds:
        return list(admissions)
    bound = {b.job_id for b in decisions.binds}
    return [w for w in admissions if getattr(w.event, "job_id", None) not in bound]
