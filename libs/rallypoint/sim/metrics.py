"""What a simulation measures: per-job records, a time-integrated recorder, and the summary.

Definitions (also in docs/simulator.md):

- JCT = end - submit; queueing delay = JCT - time spent running (all time not running, so a preempted or
  failed job's waits count too); bounded slowdown = max(1, JCT / max(duration, 10 s)).
- makespan = last end - first submit; gpu_utilization = useful GPU-seconds (gpus x duration of finished jobs)
  /
  (GPUs x makespan); alloc_fraction = time average of allocated GPUs / GPUs (includes lost and redone work).
- fragmentation: time average, over instants when some gang waits, of free healthy GPUs / GPUs; and
  ``stranded_gpu_hours``, GPU-hours left free while a waiting gang needed no more GPUs than were free in
  total.
- backlog_utilization: over instants when some job waits, allocated GPU-seconds / GPU-seconds that demand
  could fill (min(healthy GPUs, allocated + GPUs of waiting jobs)); gang shapes make 1.0 unreachable.
- quota honoured: for each team, the share of its time with pending work during which it held at least
  min(nominal, what its pending work can use of it): it holds >= nominal, or its smallest pending job would
  take it above nominal (a team whose nominal is smaller than its smallest pending job, or whose remaining
  nominal is, is owed nothing more). Only time with a job waiting counts, so a team whose waits all happen
  below nominal scores 0 even if they are short: this is the strict reading of "no team below its
  guaranteed share while it has work pending". Policies without quotas (fifo, easy-backfill, las) are
  measured the same way against the same nominals.
- Jain's fairness over teams of x = (GPU-seconds a team held while it had pending work) / (its entitled share
  of the cluster over that time), entitlement proportional to nominal quota (equal when no quotas).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec


class JobRecord(msgspec.Struct, kw_only=True):
    """One finished job, as written by --per-job (JSON Lines)."""

    id: str
    team: str
    priority: str
    submit: float
    start: float  # first start
    end: float
    gpus: int
    duration: float
    run_time: float  # time holding GPUs, all attempts
    preemptions: int = 0
    failures: int = 0
    lost_gpu_s: float = 0.0  # redone work plus checkpoint overheads
    nodes: int = 1
    racks: int = 1
    gpu_type: str | None = None
    placed_gpu_type: str | None = None  # model of the GPUs of the first placement

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def queue_delay(self) -> float:
        return max(0.0, self.jct - self.run_time)


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted list."""
    if not sorted_vals:
        return math.nan
    k = (len(sorted_vals) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def dist(vals: Iterable[float]) -> dict[str, float]:
    v = sorted(vals)
    if not v:
        return {"avg": math.nan, "p50": math.nan, "p95": math.nan, "p99": math.nan}
    return {
        "avg": sum(v) / len(v),
        "p50": percentile(v, 50),
        "p95": percentile(v, 95),
        "p99": percentile(v, 99),
    }


@dataclass
class TeamAcc:
    alloc_gpu_s: float = 0.0
    pending_time: float = 0.0
    honoured_time: float = 0.0
    alloc_while_pending_gpu_s: float = 0.0
    entitled_while_pending_gpu_s: float = 0.0


@dataclass
class Recorder:
    """Integrates piecewise-constant cluster state between event instants.

    The engine calls :meth:`step` once per instant, after its decisions, with the state that then holds until
    the next instant. Plot series are kept on a coarse grid (about ``points`` samples) to stay small.
    """

    total_gpus: int
    nominal: Mapping[str, int]
    horizon: float
    points: int = 1500
    t_prev: float | None = None
    # allocated, pending jobs, free healthy, min pending gpus, pending GPU demand
    state: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    team_alloc: dict[str, int] = field(default_factory=dict)
    team_min_pending: dict[str, int] = field(default_factory=dict)
    alloc_gpu_s: float = 0.0
    waiting_time: float = 0.0
    free_while_waiting_gpu_s: float = 0.0
    stranded_gpu_s: float = 0.0
    backlog_alloc_gpu_s: float = 0.0
    backlog_fillable_gpu_s: float = 0.0
    teams: dict[str, TeamAcc] = field(default_factory=dict)
    series_t: list[float] = field(default_factory=list)
    series_alloc: list[int] = field(default_factory=list)
    series_pending: list[int] = field(default_factory=list)
    series_team: dict[str, list[int]] = field(default_factory=dict)
    _next_sample: float = 0.0

    def _integrate(self, t: float) -> None:
        if self.t_prev is None:
            return
        dt = t - self.t_prev
        if dt <= 0:
            return
        alloc, pending, free, min_pending, demand = self.state
        self.alloc_gpu_s += alloc * dt
        if pending:
            self.waiting_time += dt
            # what demand could fill: every healthy GPU, or all running + waiting work if that is less
            self.backlog_alloc_gpu_s += alloc * dt
            self.backlog_fillable_gpu_s += min(alloc + free, alloc + demand) * dt
            self.free_while_waiting_gpu_s += free * dt
            if min_pending <= free:
                self.stranded_gpu_s += free * dt
        nom_total = sum(self.nominal.values())
        pend_teams = self.team_min_pending
        for team, a in self.team_alloc.items():
            if a:
                self._acc(team).alloc_gpu_s += a * dt
        for team, smallest in pend_teams.items():
            acc = self._acc(team)
            a = self.team_alloc.get(team, 0)
            nom = self.nominal.get(team, 0)
            acc.pending_time += dt
            if a >= nom or a + smallest > nom:
                acc.honoured_time += dt
            acc.alloc_while_pending_gpu_s += a * dt
            share = nom / nom_total if nom_total else 1.0 / max(1, len(pend_teams))
            acc.entitled_while_pending_gpu_s += share * self.total_gpus * dt

    def _acc(self, team: str) -> TeamAcc:
        acc = self.teams.get(team)
        if acc is None:
            acc = self.teams[team] = TeamAcc()
        return acc

    def step(
        self,
        t: float,
        allocated: int,
        pending_jobs: int,
        free_healthy: int,
        min_pending_gpus: int,
        pending_gpus: int,
        team_alloc: Mapping[str, int],
        team_min_pending: Mapping[str, int],
    ) -> None:
        self._integrate(t)
        self.t_prev = t
        self.state = (allocated, pending_jobs, free_healthy, min_pending_gpus, pending_gpus)
        self.team_alloc = dict(team_alloc)
        self.team_min_pending = dict(team_min_pending)
        if t >= self._next_sample:
            self.series_t.append(t)
            self.series_alloc.append(allocated)
            self.series_pending.append(pending_jobs)
            n = len(self.series_t) - 1
            for team in sorted(set(self.series_team) | set(team_alloc)):
                col = self.series_team.setdefault(team, [0] * n)
                col.append(team_alloc.get(team, 0))
            self._next_sample = t + max(1.0, self.horizon / self.points)

    def finish(self, t: float) -> None:
        self._integrate(t)
        self.t_prev = t


def jain(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x >= 0]
    if not xs:
        return math.nan
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def _group(records: Sequence[JobRecord], key: str) -> dict[str, list[JobRecord]]:
    out: dict[str, list[JobRecord]] = {}
    for r in records:
        out.setdefault(getattr(r, key), []).append(r)
    return dict(sorted(out.items()))


def summarize(
    records: Sequence[JobRecord],
    rec: Recorder,
    *,
    jobs: int,
    policy: str,
    sim_wall_s: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The --json summary."""
    g = rec.total_gpus
    first_submit = min((r.submit for r in records), default=0.0)
    last_end = max((r.end for r in records), default=0.0)
    makespan = max(0.0, last_end - first_submit)
    useful = sum(r.gpus * r.duration for r in records)
    multi = [r for r in records if r.nodes > 1]

    def block(rs: Sequence[JobRecord]) -> dict[str, Any]:
        return {"jobs": len(rs), "jct": dist(r.jct for r in rs), "queue": dist(r.queue_delay for r in rs)}

    teams = rec.teams
    honoured = {
        t: (a.honoured_time / a.pending_time if a.pending_time > 0 else 1.0) for t, a in sorted(teams.items())
    }
    fair_x = [
        a.alloc_while_pending_gpu_s / a.entitled_while_pending_gpu_s
        for _, a in sorted(teams.items())
        if a.entitled_while_pending_gpu_s > 0
    ]
    out: dict[str, Any] = {
        "policy": policy,
        "jobs": jobs,
        "completed": len(records),
        "gpus": g,
        "jct": dist(r.jct for r in records),
        "queue": dist(r.queue_delay for r in records),
        "waited": sum(1 for r in records if r.start > r.submit),
        "bounded_slowdown": dist(max(1.0, r.jct / max(r.duration, 10.0)) for r in records),
        "makespan": makespan,
        "gpu_utilization": useful / (g * makespan) if g and makespan else math.nan,
        "alloc_fraction": rec.alloc_gpu_s / (g * makespan) if g and makespan else math.nan,
        "backlog_utilization": (
            rec.backlog_alloc_gpu_s / rec.backlog_fillable_gpu_s
            if rec.backlog_fillable_gpu_s > 0
            else math.nan
        ),
        "backlog_hours": rec.waiting_time / 3600.0,
        "preemptions": sum(r.preemptions for r in records),
        "failures": sum(r.failures for r in records),
        "gpu_hours_lost": sum(r.lost_gpu_s for r in records) / 3600.0,
        "fragmentation": {
            "free_fraction_while_waiting": (
                rec.free_while_waiting_gpu_s / (g * rec.waiting_time) if rec.waiting_time > 0 and g else 0.0
            ),
            "stranded_gpu_hours": rec.stranded_gpu_s / 3600.0,
        },
        "multi_node_gangs": len(multi),
        "multi_node_one_rack_share": (sum(1 for r in multi if r.racks == 1) / len(multi))
        if multi
        else math.nan,
        "quota_honoured": {"per_team": honoured, "min": min(honoured.values(), default=1.0)},
        "jain_fairness": jain(fair_x),
        "per_class": {k: block(v) for k, v in _group(records, "priority").items()},
        "per_team": {k: block(v) for k, v in _group(records, "team").items()},
    }
    if sim_wall_s is not None:
        out["sim_wall_s"] = sim_wall_s
    if extra:
        out.update(extra)
    return out
