"""Per team and cohort: nominal, borrowed, used, pending (``rally queues``, like ``kueuectl list``).

Used and pending come from the fold now; nominal and limits from the queue file the scheduler reads
(``scheduling.queues``). Without one there are no quotas: every team shows used and pending only. GPUs are
counted as quota counts them: a share or a MIG slice is its part of one (``quota_milli``), so four
quarter-GPU notebooks use 1. Each team lists its users too (org -> team -> user): their decayed usage,
which fair share between the team's users orders by (``userusage``), their weight and their jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from rallypoint.events.catalogue import GPU_MILLI, JobSpec, mig_milli, quota_milli
from rallypoint.scheduling.queues import Queues
from rallypoint.state import ACTIVE, ClusterState
from rallypoint.userusage import HORIZON_DAYS, UserUsage, day_of, decayed_gpu_s, running_by_day

NO_COHORT = "default"


class UserRow(msgspec.Struct, kw_only=True):
    """One user of a team: the fair share between the team's users puts the lowest ``usage_gpu_h`` per
    ``weight`` first."""

    user: str
    #: the queue file's weight for the user in the team (``users:``; 1 unless listed)
    weight: float
    #: GPU-hours used in the team, decayed with the half-life (``userusage``), running jobs included
    usage_gpu_h: float
    running_jobs: int
    running_gpus: float
    pending_jobs: int


class QueueRow(msgspec.Struct, kw_only=True):
    team: str
    cohort: str
    #: the org the team belongs to in the queue file (None: none)
    parent: str | None = None
    #: None: no queue file, or the team is not in it (a nominal of 0 for the scheduler)
    nominal: int | None
    borrowing_limit: int | None
    used: float
    #: GPUs used above nominal, lent by the cohort's idle quota
    borrowed: float
    running_jobs: int
    pending_jobs: int
    pending_gpus: float
    #: the team's users (jobs submitted without one are not listed), lightest first per weight
    users: list[UserRow] = []


class CohortRow(msgspec.Struct, kw_only=True):
    cohort: str
    teams: list[str]
    nominal: int | None
    used: float
    borrowed: float
    pending_gpus: float


class OrgRow(msgspec.Struct, kw_only=True):
    """An org of the queue file: its limit caps the GPUs of every team below it (at any depth)."""

    org: str
    parent: str | None
    #: None: the org only groups
    limit: int | None
    teams: list[str]
    used: float
    pending_gpus: float


class QueuesReport(msgspec.Struct, kw_only=True):
    quotas: bool
    teams: list[QueueRow]
    cohorts: list[CohortRow]
    orgs: list[OrgRow] = []
    total_gpus: int
    free_gpus: int
    seq: int


def queues_report(state: ClusterState, queues: Queues | None, *, now: float | None = None) -> QueuesReport:
    """``now``: when users' usage is decayed to (None: the wall clock)."""
    used: dict[str, int] = {}  # thousandths of a GPU: summed exactly, shown as GPUs
    running: dict[str, int] = {}
    pending_jobs: dict[str, int] = {}
    pending_gpus: dict[str, int] = {}
    for job in state.jobs.values():
        team = job.spec.team
        if job.state in ACTIVE:
            used[team] = used.get(team, 0) + quota_milli(job.spec, job.placements)
            running[team] = running.get(team, 0) + 1
        elif job.state == "pending" and not job.cancel_requested:
            pending_jobs[team] = pending_jobs.get(team, 0) + 1
            pending_gpus[team] = pending_gpus.get(team, 0) + _wanted_milli(job.spec)
    configured = {t.name: t for t in queues.teams} if queues is not None else {}
    names = sorted(set(used) | set(pending_jobs) | set(configured))
    rows = []
    for name in names:
        conf = configured.get(name)
        nominal = conf.nominal if conf is not None else None
        team_used = used.get(name, 0) / GPU_MILLI
        rows.append(
            QueueRow(
                team=name,
                cohort=conf.cohort if conf is not None else NO_COHORT,
                parent=conf.parent if conf is not None else None,
                nominal=nominal,
                borrowing_limit=conf.borrowing_limit if conf is not None else None,
                used=team_used,
                borrowed=max(0, team_used - (nominal or 0)) if queues is not None else 0,
                running_jobs=running.get(name, 0),
                pending_jobs=pending_jobs.get(name, 0),
                pending_gpus=pending_gpus.get(name, 0) / GPU_MILLI,
            )
        )
    _add_users(rows, state, queues, time.time() if now is None else now)
    return QueuesReport(
        quotas=queues is not None,
        teams=rows,
        cohorts=_cohorts(rows, quotas=queues is not None),
        orgs=_orgs(rows, queues) if queues is not None else [],
        total_gpus=state.total_gpus(),
        free_gpus=state.free_gpus(),
        seq=state.last_seq,
    )


def _wanted_milli(spec: JobSpec) -> int:
    """The GPU quota a waiting job will take once it starts, in thousandths: its share (one asking only for
    GPU memory: a whole GPU, its share being known only where it lands), its MIG slice's part, else its
    GPUs (an elastic gang's minimum: it starts once that fits)."""
    if spec.gpu_milli is not None:
        return spec.gpu_milli
    if spec.mig_profile is not None:
        return mig_milli(spec.mig_profile)
    return (spec.min_gpus if spec.min_gpus is not None else spec.gpus) * GPU_MILLI


def _add_users(rows: list[QueueRow], state: ClusterState, queues: Queues | None, now: float) -> None:
    """Each team's users: those with usage on record or jobs running or waiting."""
    # (team, user) -> [running jobs, running GPU thousandths, pending]
    counts: dict[tuple[str, str], list[int]] = {}
    for job in state.jobs.values():
        if job.user is None:
            continue
        c = counts.setdefault((job.spec.team, job.user), [0, 0, 0])
        if job.state in ACTIVE:
            c[0] += 1
            c[1] += quota_milli(job.spec, job.placements)
        elif job.state == "pending" and not job.cancel_requested:
            c[2] += 1
    first = day_of(now) - HORIZON_DAYS
    by_team = {r.team: r for r in rows}
    pairs = set(counts) | {(t, u) for t, users in state.users.items() for u in users}
    for team, user in sorted(pairs):
        row = by_team.get(team)
        if row is None:
            continue
        ledger = state.users.get(team, {}).get(user)
        gpu_s = 0.0
        if ledger is not None:
            days = tuple(sorted((d, g) for d, g in ledger.days.items() if d >= first))
            usage = UserUsage(team=team, user=user, days=days, running=running_by_day(ledger))
            gpu_s = decayed_gpu_s(usage, now)
        running_jobs, running_gpus, waiting = counts.get((team, user), [0, 0, 0])
        weight = queues.team(team).users.get(user, 1.0) if queues is not None else 1.0
        row.users.append(
            UserRow(
                user=user,
                weight=weight,
                usage_gpu_h=round(gpu_s / 3600.0, 2),
                running_jobs=running_jobs,
                running_gpus=running_gpus / GPU_MILLI,
                pending_jobs=waiting,
            )
        )
    for row in rows:
        row.users.sort(key=lambda u: (u.usage_gpu_h / u.weight, u.user))


def _gpus(parts: Iterable[float]) -> float:
    """A sum of GPU counts in thousandths (each a whole number of thousandths): rounded back to them, so
    0.1 + 0.2 reads 0.3."""
    return round(sum(parts), 3)


def _cohorts(rows: list[QueueRow], *, quotas: bool) -> list[CohortRow]:
    by: dict[str, list[QueueRow]] = {}
    for row in rows:
        by.setdefault(row.cohort, []).append(row)
    return [
        CohortRow(
            cohort=name,
            teams=[r.team for r in members],
            nominal=sum(r.nominal or 0 for r in members) if quotas else None,
            used=_gpus(r.used for r in members),
            borrowed=_gpus(r.borrowed for r in members),
            pending_gpus=_gpus(r.pending_gpus for r in members),
        )
        for name, members in sorted(by.items())
    ]


def _orgs(rows: list[QueueRow], queues: Queues) -> list[OrgRow]:
    """Each org's teams at any depth, and what they use and wait for together (what its limit caps)."""
    below: dict[str, list[QueueRow]] = {org.name: [] for org in queues.orgs}
    for row in rows:
        for org in queues.lineage(row.team):
            below.setdefault(org, []).append(row)
    return [
        OrgRow(
            org=org.name,
            parent=org.parent,
            limit=org.limit,
            teams=[r.team for r in below[org.name]],
            used=_gpus(r.used for r in below[org.name]),
            pending_gpus=_gpus(r.pending_gpus for r in below[org.name]),
        )
        for org in sorted(queues.orgs, key=lambda o: o.name)
    ]
