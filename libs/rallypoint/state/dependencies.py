"""Job dependencies and singletons, read from the fold (issue 35).

A pending job with ``spec.depends_on`` or ``spec.singleton`` is *held* until each dependency is met and,
for a singleton, every earlier job of its team with its name has ended. A held job is not ready: the
scheduler never sees it (``ClusterState.ready_jobs``), and the job controller fails one whose dependency
can never be met (``control.reconcile``). Everything here is a function of the fold, so every reader
(scheduler, API, audit, simulator's twin) holds and releases the same jobs at the same log position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal

from rallypoint.events import Dependency

if TYPE_CHECKING:
    from .cluster import JobView

__all__ = [
    "ARRAY_LIMIT_PREFIX",
    "DependencyStatus",
    "dependency_status",
    "hold_code",
    "hold_message",
    "kind_status",
    "never_met",
    "throttle_holds",
]

DependencyStatus = Literal["met", "waiting", "never"]
#: How a hold by an array's limit begins (``hold_code`` tells it from a dependency's).
ARRAY_LIMIT_PREFIX = "array limit: "

_WAITS_FOR = {
    "after": "to be placed",
    "after-ok": "to complete",
    "after-not-ok": "to fail or be cancelled",
    "after-any": "to end",
}


def dependency_status(dep: Dependency, jobs: Mapping[str, JobView]) -> DependencyStatus:
    """Whether ``dep`` is met, may still be, or can no longer be (its job ended the wrong way, or is gone)."""
    other = jobs.get(dep.job_id)
    if other is None:
        return "never"
    return kind_status(dep.kind, placed=other.attempt > 0, ended=other.state if other.terminal else None)


def kind_status(kind: str, *, placed: bool, ended: str | None) -> DependencyStatus:
    """The rule itself, for a job that has (``placed``: its first attempt was given its GPUs) and has
    ``ended`` (``completed``, ``failed``, ``cancelled``, ``rejected``; None: not yet): the fold and the
    simulator both ask it. ``after`` counts the first placement as the start, the moment both see."""
    if kind == "after":
        if placed:
            return "met"
        return "never" if ended is not None else "waiting"
    if ended is None:
        return "waiting"
    if kind == "after-any":
        return "met"
    return "met" if (ended == "completed") == (kind == "after-ok") else "never"


def never_met(job: JobView, jobs: Mapping[str, JobView]) -> str | None:
    """The reason ``job`` can never start because of a dependency (None: it still may)."""
    for dep in job.spec.depends_on:
        if dependency_status(dep, jobs) == "never":
            other = jobs.get(dep.job_id)
            how = f"ended {other.state}" if other is not None and other.terminal else "is gone"
            if other is not None and dep.kind == "after" and other.terminal:
                how = f"ended {other.state} without being placed"
            return f"dependency can never be met: {dep.job_id} {how} ({dep.kind})"
    return None


def hold_message(
    job: JobView, jobs: Mapping[str, JobView], same_name_earlier: Iterable[str] = ()
) -> str | None:
    """Why ``job`` is held (None: it is not): the first dependency not met yet, else the earlier job of the
    same name a singleton waits for. ``same_name_earlier``: live jobs of its team and name submitted before
    it, in arrival order (read only for a singleton)."""
    for dep in job.spec.depends_on:
        status = dependency_status(dep, jobs)
        if status != "met":
            if status == "never":
                return never_met(job, jobs)
            return f"waiting for {dep.job_id} {_WAITS_FOR[dep.kind]} ({dep.kind})"
    if job.spec.singleton:
        for other_id in same_name_earlier:
            return f"singleton: waiting for {other_id} (same name and team) to end"
    return None


def throttle_holds(members: Mapping[str, JobView], held: Iterable[str] = ()) -> dict[str, str]:
    """The pending members of one throttled array (``members``: its live ones) that its limit holds, with
    why: members holding GPUs count against it; the waiting ones not ``held`` otherwise (by a dependency)
    take what is left in index order."""
    some = next(iter(members.values()), None)
    if some is None or some.spec.array is None or some.spec.array.max_running is None:
        return {}
    limit = some.spec.array.max_running
    blocked = set(held)
    active = sum(1 for m in members.values() if m.state != "pending")
    waiting = sorted(
        (
            m
            for m in members.values()
            if m.state == "pending" and not m.cancel_requested and m.job_id not in blocked
        ),
        key=lambda m: m.spec.array.index if m.spec.array is not None else 0,
    )
    # no array id in it: a message naming an id that is no job's would be redacted for the team itself
    why = f"{ARRAY_LIMIT_PREFIX}{active} of its {limit} members at once hold GPUs"
    return {m.job_id: why for m in waiting[max(0, limit - active) :]}


def hold_code(message: str) -> str:
    """The pending-reason code of a hold: ``ArrayLimit`` for an array's limit, else ``Dependency``."""
    return "ArrayLimit" if message.startswith(ARRAY_LIMIT_PREFIX) else "Dependency"
