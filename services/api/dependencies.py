"""A submission's dependencies, checked against the fold before anything is appended (issue 35).

Each job a submission waits for must exist (the fold is brought up to every acknowledged write first when
one is missing, so a job just accepted by another replica counts), must be the submitting team's unless
the token is an admin's, and must still be able to meet its dependency: waiting on a job that already
failed with ``after-ok`` would wait forever, so it is refused at once. A cycle cannot form: a job may only
wait for jobs that exist before it does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from rallypoint.events import Dependency, JobSpec
from rallypoint.jobs.validate import SpecError
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState, JobView
from rallypoint.state.dependencies import dependency_status

from .problems import invalid_spec

__all__ = ["dependency_refusal", "held_at_submit", "with_array_members"]


async def dependency_refusal(
    spec: JobSpec,
    who: Principal,
    state: Callable[[], ClusterState],
    caught_up: Callable[[], Awaitable[web.Response | None]],
) -> web.Response | None:
    """The 4xx (or 503) for ``spec``'s dependencies, or None when each may wait on its job."""
    if not spec.depends_on:
        return None
    if any(dep.job_id not in state().jobs for dep in spec.depends_on):
        not_ready = await caught_up()
        if not_ready is not None:
            return not_ready
    jobs = state().jobs
    for i, dep in enumerate(spec.depends_on):
        field = f"depends_on[{i}].job_id"
        other = jobs.get(dep.job_id)
        if other is None or not (who.admin or other.spec.team == spec.team):
            # another team's job is answered as a missing one: its existence is not this team's to learn
            return invalid_spec(SpecError(field, f"job {dep.job_id!r} does not exist"))
        if dependency_status(dep, jobs) == "never":
            how = f"it {other.state} without being placed" if dep.kind == "after" else f"it {other.state}"
            return invalid_spec(SpecError(field, f"{dep.kind} on {dep.job_id} can never be met: {how}"))
    return None


async def with_array_members(
    spec: JobSpec,
    who: Principal,
    state: Callable[[], ClusterState],
    caught_up: Callable[[], Awaitable[web.Response | None]],
) -> JobSpec | web.Response:
    """``spec`` with each dependency on a whole array (its id, ``rally submit --array`` printed it) replaced
    by the same dependency on every member: ``after-ok`` on an array waits until all of them completed,
    as Slurm's ``afterok`` on an array job does. An id that is neither a job nor an array the caller sees is
    left for ``dependency_refusal`` to refuse."""
    if not spec.depends_on:
        return spec
    if any(dep.job_id not in state().jobs for dep in spec.depends_on):
        not_ready = await caught_up()
        if not_ready is not None:
            return not_ready
    jobs = state().jobs
    missing = {dep.job_id for dep in spec.depends_on if dep.job_id not in jobs}
    if not missing:
        return spec
    members: dict[str, list[str]] = {}
    for job in jobs.values():  # (only when a dependency names no job: arrays have no index of their own)
        array = job.spec.array
        if array is not None and array.array_id in missing and (who.admin or job.spec.team == spec.team):
            members.setdefault(array.array_id, []).append(job.job_id)
    expanded: list[Dependency] = []
    for dep in spec.depends_on:
        ids = sorted(members.get(dep.job_id, ()), key=lambda j: jobs[j].spec.array.index)  # type: ignore[union-attr]
        if ids:
            expanded.extend(Dependency(kind=dep.kind, job_id=j) for j in ids)
        else:
            expanded.append(dep)
    return msgspec.structs.replace(spec, depends_on=tuple(dict.fromkeys(expanded)))


def held_at_submit(state: ClusterState, spec: JobSpec) -> str | None:
    """Why a job of ``spec`` submitted now would wait on its dependencies or its name (None: it would not)."""
    if not (spec.depends_on or spec.singleton):
        return None
    job = JobView(job_id="dry-run", spec=spec, submitted_at=0.0, submitted_seq=state.last_seq + 1)
    return state.hold_of(job)
