"""``rally sim --from-log``: what-if on a cluster's real history.

Two answers from one log (a ``rally replay --export`` file, or the live log):

- **reproduction**: every recorded decision recomputed under the settings its leader recorded, by the
  audit (``rally replay --verify-decisions``'s ``verify_decisions``): ``decisions`` and
  ``decisions_identical``. This is the exact replay: the core on the fold at each decision's sequence;
- **what-if**: the recorded arrivals (each ``JobSubmitted`` at its time, with its spec) replayed by the
  simulator on the recorded nodes, each job running as long as it really ran (its attempts' run time), under
  another policy, queue file or both; compared per team with what really happened: jobs, mean and P90
  wait, mean JCT, GPU-hours and preemptions, and the cluster's utilization over each run's span.

A job that never ran (cancelled or rejected while waiting) is left out of the what-if: it has no runtime.
Neither answer changes the log; both are deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from rallypoint.audit import verify_decisions
from rallypoint.events import Event, GangBound, SchedulerSettings
from rallypoint.events.codec import Quarantined
from rallypoint.events.subjects import members
from rallypoint.predict.live import runtime_of
from rallypoint.predict.runtimes import quantile
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.queues import Queues
from rallypoint.state import ClusterState, JobView

from .cluster import Cluster, Node
from .engine import Simulator
from .metrics import JobRecord
from .workload import Job

__all__ = ["from_log"]

History = Sequence[tuple[int, Event | Quarantined]]


def folded(history: Iterable[tuple[int, Event | Quarantined]]) -> ClusterState:
    state = ClusterState()
    for seq, item in history:
        state.apply_stored(seq, item)
    return state


def recorded_policy(history: History) -> str:
    """The policy of the last leader that recorded its settings ("rallypoint" before any did)."""
    names = [item.policy for _, item in history if isinstance(item, SchedulerSettings)]
    return names[-1] if names else "rallypoint"


def log_cluster(state: ClusterState) -> Cluster:
    """The recorded nodes as the simulator's cluster: GPU count, type, rack, spine, CPU and memory, GPUs in
    MIG mode and their memory, labels and taints."""
    nodes = tuple(
        Node(
            id=n.node_id,
            rack=n.rack,
            spine=n.spine,
            gpus=n.gpu_count,
            gpu_type=n.gpu_type,
            cpu=n.cpu_milli,
            memory=n.memory_mib,
            mig_gpus=tuple(g.index for g in n.gpus if g.mig),
            gpu_memory=min((g.memory_mib for g in n.gpus), default=0),
            labels=dict(n.labels),
            taints=n.taints,
        )
        for n in sorted(state.nodes.values(), key=lambda n: n.node_id)
    )
    return Cluster(nodes=nodes, name="from-log")


def ran(job: JobView) -> float | None:
    """Seconds the job held GPUs in all, as recorded (None: it never ran)."""
    if (done := runtime_of(job)) is not None:
        return done
    if job.started_at is None:
        return None if job.run_s <= 0 else job.run_s
    end = job.ended_at if job.ended_at is not None else job.started_at
    return job.run_s + max(0.0, end - job.started_at)


def log_workload(state: ClusterState, t0: float) -> list[Job]:
    """Every job that ran, submitted at its recorded time (seconds after ``t0``) for its recorded run."""
    jobs = []
    for view in sorted(state.jobs.values(), key=lambda j: j.submitted_seq):
        seconds = ran(view)
        if seconds is None:
            continue
        spec = view.spec
        types = spec.gpu_types or ((spec.gpu_type,) if spec.gpu_type else ())
        jobs.append(
            Job(
                id=view.job_id,
                submit=view.submitted_at - t0,
                gpus=spec.gpus,
                duration=max(seconds, 1e-3),
                team=spec.team,
                gpus_per_task=spec.gpus_per_task,
                time_limit=None if spec.time_limit_s is None else float(spec.time_limit_s),
                priority=spec.priority,
                min_gpus=spec.min_gpus,
                max_gpus=spec.max_gpus,
                gpu_step=spec.gpu_step,
                gpu_type="|".join(types) or None,
                user=view.user,  # fair share between a team's users, as live
                # what it asked for beside whole GPUs, and where it may run, as its spec says
                cpu_milli=spec.cpu_milli,
                memory_mib=spec.memory_mib,
                gpu_milli=spec.gpu_milli,
                gpu_memory_mib=spec.gpu_memory_mib,
                mig_profile=spec.mig_profile,
                node_selector=dict(spec.node_selector),
                tolerations=spec.tolerations,
                affinity=spec.affinity,
            )
        )
    return jobs


Row = tuple[float, float, float, int]


def _team_figures(rows: Sequence[Row]) -> dict[str, Any]:
    """(wait, jct, gpu_s, preemptions) rows of one team's jobs -> its figures (P90: nearest rank, as the
    runtime estimator's quantiles)."""
    waits = sorted(r[0] for r in rows)
    return {
        "jobs": len(rows),
        "mean_wait_s": round(sum(waits) / len(rows), 3),
        "p90_wait_s": round(quantile(waits, 0.9), 3),
        "mean_jct_s": round(sum(r[1] for r in rows) / len(rows), 3),
        "gpu_hours": round(sum(r[2] for r in rows) / 3600, 4),
        "preemptions": sum(r[3] for r in rows),
    }


def first_binds(history: History) -> dict[str, float]:
    """When each job first held GPUs: its first ``GangBound`` (a preempted job's later binds come after)."""
    first: dict[str, float] = {}
    for _, stored in history:
        for item in members(stored):
            if isinstance(item, GangBound):
                first.setdefault(item.job_id, item.at)
    return first


def actual_by_team(state: ClusterState, ids: set[str], first: dict[str, float]) -> dict[str, dict[str, Any]]:
    """What really happened to the jobs ``ids``: first bind, end and run time from the log."""
    rows: dict[str, list[Row]] = defaultdict(list)
    for job_id in sorted(ids):
        view = state.jobs[job_id]
        held = ran(view) or 0.0
        start = first.get(job_id, view.submitted_at)
        end = view.ended_at if view.ended_at is not None else start + held
        row = (max(0.0, start - view.submitted_at), end - view.submitted_at, held * view.spec.gpus)
        rows[view.spec.team].append((*row, view.preemptions))
    return {team: _team_figures(r) for team, r in sorted(rows.items())}


def simulated_by_team(records: Sequence[JobRecord]) -> dict[str, dict[str, Any]]:
    rows: dict[str, list[Row]] = defaultdict(list)
    for r in records:
        rows[r.team].append((r.queue_delay, r.jct, r.run_time * r.gpus, r.preemptions))
    return {team: _team_figures(rs) for team, rs in sorted(rows.items())}


def _utilization(busy_gpu_s: float, total_gpus: int, span_s: float) -> float | None:
    if total_gpus <= 0 or span_s <= 0:
        return None
    return round(busy_gpu_s / (total_gpus * span_s), 4)


def from_log(history: History, *, policy: str | None = None, queues: Queues | None = None) -> dict[str, Any]:
    """The reproduction and the what-if of ``history`` (see the module's docstring), as one JSON object."""
    history = list(history)
    audit = verify_decisions(history, SchedulingPolicy())
    state = folded(history)
    chosen = policy or recorded_policy(history)
    t0 = min((j.submitted_at for j in state.jobs.values()), default=0.0)
    jobs = log_workload(state, t0)
    cluster = log_cluster(state)
    result = Simulator(jobs, cluster, chosen, queues).run()
    ids = {j.id for j in jobs}
    actual_span = max((j.ended_at or 0.0 for j in state.jobs.values() if j.job_id in ids), default=t0) - t0
    sim_span = max((r.end for r in result.records), default=0.0)
    busy = sum(j.duration * j.gpus for j in jobs)
    return {
        "decisions": audit.decisions,
        "decisions_identical": audit.ok and audit.verified == audit.decisions,
        "verified": audit.verified,
        "differ": len(audit.mismatches),
        "recorded_policy": recorded_policy(history),
        "policy": chosen,
        "nodes": len(cluster.nodes),
        "gpus": cluster.total_gpus,
        "jobs": len(jobs),
        "unfinished_in_sim": len(result.unfinished),
        "utilization": {
            "actual": _utilization(busy, cluster.total_gpus, actual_span),
            "simulated": _utilization(busy, cluster.total_gpus, sim_span),
        },
        "teams": {
            team: {"actual": figures, "simulated": simulated_by_team(result.records).get(team)}
            for team, figures in actual_by_team(state, ids, first_binds(history)).items()
        },
    }
