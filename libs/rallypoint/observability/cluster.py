"""Cluster gauges computed from the folded state when Prometheus scrapes: no cost per event.

Everything here is a function of the log, so every replica that folds it reports the same numbers and a
restart does not reset them (the ``*_total`` families are sums over the log, monotonic like counters).
The scheduler exports these (``services/scheduler``); other services export only their own instruments,
so a Grafana ``sum()`` over instances does not count the cluster twice per service.

Definitions (docs/observability.md):
- a GPU is ``unhealthy`` when its node is not ``up`` (unreachable, drained, lost), else ``allocated`` or
  ``free``;
- ``fragmented`` GPUs are free GPUs on up nodes where no pending job's task fits: fewer free GPUs of the
  right type on that node than the smallest task (``gpus_per_task``) any pending job of that type asks
  for. Nothing pending, nothing stranded: 0;
- a job's allocated GPU-seconds are the GPU-seconds of its ended attempts plus its current (or last)
  attempt's run so far; goodput is 1 - lost / allocated, ``lost`` being the work a preemption or failure
  threw away since the last committed checkpoint (``lost_gpu_s`` of the events).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rallypoint.health.detection import DEGRADED, FAILED, HEALTHY, SUSPECT
from rallypoint.state import ClusterState, JobView, NodeStatus, NodeView

if TYPE_CHECKING:  # the core is slow to import, and the event log imports this package
    from rallypoint.core.types import Queue

#: Checkpoint save times: small test models save in milliseconds, 70B-parameter shards in minutes.
CHECKPOINT_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
GPU_STATES = ("allocated", "free", "unhealthy")
NODE_STATUSES: tuple[str, ...] = get_args(NodeStatus)
NODE_HEALTHS = (HEALTHY, SUSPECT, DEGRADED, FAILED)


def cluster_families(state: ClusterState, now: float, queues: Sequence[Queue] = ()) -> list[Metric]:
    """Every cluster family, computed in one pass over nodes and one over jobs."""
    return [
        *_gpu_families(state.nodes.values()),
        _fragmentation(state),
        *_queue_families(state.pending_jobs()),
        *_team_families(state, now, queues),
        _checkpoint_saves(state.jobs.values()),
        _gauge("rally_log_fold_seq", "Last stream sequence this fold applied.", [((), state.last_seq)]),
        _refused_facts(state),
    ]


def _refused_facts(state: ClusterState) -> Metric:
    """Facts the fold refused to believe, by kind: zero series included, so an alert can watch each."""
    kinds = {
        # a node speaking for ranks it does not run (docs/security.md)
        "foreign_rank_exit": state.foreign_exits,
        # stored where its writer may not write: quarantined as misplaced
        "misplaced": state.quarantine.by_reason.get("misplaced", 0),
        # a re-registration that changed a node's hardware, held for an operator
        "held_registration": sum(1 for n in state.nodes.values() if n.held_registration is not None),
    }
    return _gauge(
        "rally_refused_facts",
        "Events the fold did not apply because their writer had no right to them (or, held_registration, "
        "not without an operator), by kind; rally replay --verify-decisions names each.",
        (((kind,), count) for kind, count in kinds.items()),
        ["kind"],
    )


def _gauge(
    name: str, doc: str, samples: Iterable[tuple[tuple[str, ...], float]], labels: Sequence[str] = ()
) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _gpu_families(nodes: Iterable[NodeView]) -> list[Metric]:
    gpus: Counter[tuple[str, str, str]] = Counter()
    statuses: Counter[tuple[str, str]] = Counter()
    health: Counter[tuple[str, str]] = Counter()
    for node in nodes:
        statuses[(node.rack, node.status)] += 1
        health[(node.rack, node.health)] += 1
        if node.status != "up":
            gpus[(node.rack, node.gpu_type, "unhealthy")] += node.gpu_count
            continue
        allocated = sum(1 for g in node.gpus if g.index in node.allocated)
        gpus[(node.rack, node.gpu_type, "allocated")] += allocated
        # a cordoned node's idle GPUs take no work: not free capacity
        idle_state = "unhealthy" if node.cordoned else "free"
        gpus[(node.rack, node.gpu_type, idle_state)] += node.gpu_count - allocated
    # Every (rack, type) lists all three states, and every rack each node status and health, zeros
    # included: a series that vanishes at 0 (no node lost) is one an alert on it cannot see.
    types = sorted({(rack, gpu_type) for rack, gpu_type, _ in gpus})
    racks = sorted({rack for rack, _ in statuses})
    return [
        _gauge(
            "rally_gpus",
            "GPUs by rack, GPU type and state (allocated, free, unhealthy = node not up, or idle on a "
            "cordoned node).",
            (((r, t, s), gpus[(r, t, s)]) for r, t in types for s in GPU_STATES),
            ["rack", "gpu_type", "state"],
        ),
        _gauge(
            "rally_nodes",
            "Registered nodes by rack and status (up, unreachable, drained, lost).",
            (((r, s), statuses[(r, s)]) for r in racks for s in NODE_STATUSES),
            ["rack", "status"],
        ),
        _gauge(
            "rally_nodes_by_health",
            "Registered nodes by rack and the health monitor's verdict (healthy, suspect, degraded, failed).",
            (((r, h), health[(r, h)]) for r in racks for h in NODE_HEALTHS),
            ["rack", "health"],
        ),
    ]


def fragmented_gpus(state: ClusterState) -> dict[str, int]:
    """Free GPUs no pending job could use, by GPU type (see the module docstring)."""
    smallest: dict[str | None, int] = {}  # GPU type (None: any) -> smallest task any pending job asks
    for job in state.pending_jobs():
        spec = job.spec
        for gpu_type in spec.gpu_types or (spec.gpu_type,):
            smallest[gpu_type] = min(smallest.get(gpu_type, spec.gpus_per_task), spec.gpus_per_task)
    stranded: Counter[str] = Counter()
    if not smallest:
        return {}
    for node in state.nodes.values():
        if not node.schedulable:
            continue
        free = node.gpu_count - len(node.allocated)
        need = min(smallest.get(node.gpu_type, free + 1), smallest.get(None, free + 1))
        stranded[node.gpu_type] += free if free < need else 0
    return dict(stranded)


def _fragmentation(state: ClusterState) -> Metric:
    return _gauge(
        "rally_gpus_fragmented",
        "Free GPUs on up nodes where no pending job's task fits (too few free GPUs of its type there).",
        (((gpu_type,), count) for gpu_type, count in sorted(fragmented_gpus(state).items())),
        ["gpu_type"],
    )


def _queue_families(pending: list[JobView]) -> list[Metric]:
    workloads: Counter[tuple[str, str]] = Counter()
    gpus: Counter[str] = Counter()
    for job in pending:
        workloads[(job.spec.team, job.pending_code or "Queued")] += 1
        gpus[job.spec.team] += job.spec.gpus
    return [
        _gauge(
            "rally_pending_workloads",
            "Jobs waiting for a bind, by team and pending reason code (Kueue pending_workloads).",
            sorted(workloads.items()),
            ["team", "reason"],
        ),
        _gauge(
            "rally_pending_gpus",
            "GPUs asked for by the jobs waiting for a bind, by team.",
            (((team,), n) for team, n in sorted(gpus.items())),
            ["team"],
        ),
    ]


def allocated_gpu_s(job: JobView, now: float) -> float:
    """GPU-seconds the job's attempts have held GPUs while running (ended attempts + the current one)."""
    current = 0.0
    if job.started_at is not None:
        current = max(0.0, (job.ended_at or now) - job.started_at) * job.bound_gpus
    return job.attained_gpu_s + current


def _team_families(state: ClusterState, now: float, queues: Sequence[Queue]) -> list[Metric]:
    usage: Counter[str] = Counter()
    allocated: defaultdict[str, float] = defaultdict(float)
    lost: defaultdict[str, float] = defaultdict(float)
    interruptions: Counter[str] = Counter()
    preemptions: Counter[tuple[str, str]] = Counter()
    for node in state.nodes.values():
        for job_id in node.allocated.values():
            job = state.jobs.get(job_id)
            usage[job.spec.team if job is not None else ""] += 1
    for job in state.jobs.values():
        team = job.spec.team
        allocated[team] += allocated_gpu_s(job, now)
        lost[team] += job.lost_gpu_s
        interruptions[team] += job.infra_failures
        if job.preemptions:
            preemptions[(team, job.preempt_reason or "unknown")] += job.preemptions
    teams = sorted(allocated)
    families: list[Metric] = [
        _gauge(
            "rally_team_gpus_allocated",
            "GPUs held by each team's jobs now (Kueue cluster_queue_resource_usage).",
            (((team,), usage[team]) for team in sorted(set(usage) | set(teams))),
            ["team"],
        ),
        _gauge(
            "rally_team_goodput_ratio",
            "1 - lost / allocated GPU-seconds per team: the share of held GPU time not thrown away.",
            (((t,), 1.0 - lost[t] / allocated[t] if allocated[t] > 0 else 1.0) for t in teams),
            ["team"],
        ),
    ]
    families += [
        _counter("rally_team_allocated_gpu_seconds", "GPU-seconds held by running attempts, per team.",
                 (((t,), allocated[t]) for t in teams), ["team"]),
        _counter("rally_lost_gpu_seconds", "GPU-seconds of work lost to preemptions and failures, per team.",
                 (((t,), lost[t]) for t in teams), ["team"]),
        _counter("rally_job_interruptions", "Infrastructure failures of running gangs (each one a recovery).",
                 (((t,), interruptions[t]) for t in teams), ["team"]),
        _counter("rally_job_preemptions", "Preempted attempts per team and (latest) preemption reason.",
                 sorted(preemptions.items()), ["team", "reason"]),
    ]  # fmt: skip
    families.extend(_quota(queues, usage))
    return families


def _counter(
    name: str, doc: str, samples: Iterable[tuple[tuple[str, ...], float]], labels: Sequence[str]
) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _quota(queues: Sequence[Queue], usage: Counter[str]) -> list[Metric]:
    """Per team: nominal and borrowed GPUs (held above nominal); per org (a queue other queues name as
    parent): its limit and what every team below it holds."""
    nominal = GaugeMetricFamily(
        "rally_team_nominal_quota_gpus",
        "Guaranteed GPUs per team and GPU type, from the queue configuration (Kueue nominal_quota).",
        labels=["team", "gpu_type"],
    )
    borrowed = GaugeMetricFamily(
        "rally_team_gpus_borrowed",
        "GPUs a team holds above its nominal quota, lent by idle quota of its cohort.",
        labels=["team"],
    )
    org_limit = GaugeMetricFamily(
        "rally_org_gpus_limit", "The most GPUs the teams below an org may hold together.", labels=["org"]
    )
    org_used = GaugeMetricFamily(
        "rally_org_gpus_allocated", "GPUs held by the teams below an org, at any depth.", labels=["org"]
    )
    parent_of = {q.name: q.parent for q in queues}
    orgs = {q.parent for q in queues if q.parent is not None}
    below: Counter[str] = Counter()
    for queue in queues:
        if queue.name in orgs:
            continue
        for quota in queue.quotas:
            nominal.add_metric([queue.name, quota.gpu_type], quota.nominal)
        guaranteed = sum(quota.nominal for quota in queue.quotas)
        borrowed.add_metric([queue.name], max(0, usage[queue.name] - guaranteed))
        parent, seen = queue.parent, set()
        while parent is not None and parent not in seen:
            seen.add(parent)
            below[parent] += usage[queue.name]
            parent = parent_of.get(parent)
    for queue in queues:
        if queue.name in orgs:
            for quota in queue.quotas:
                org_limit.add_metric([queue.name], quota.nominal + (quota.borrowing_limit or 0))
            org_used.add_metric([queue.name], below[queue.name])
    return [nominal, borrowed, org_limit, org_used]


def _checkpoint_saves(jobs: Iterable[JobView]) -> Metric:
    """A histogram of every committed checkpoint's save time (``CheckpointCommitted.save_s``)."""
    counts = [0] * len(CHECKPOINT_BUCKETS)
    total, n = 0.0, 0
    for job in jobs:
        for checkpoint in job.checkpoints:
            n += 1
            total += checkpoint.save_s
            for i, bound in enumerate(CHECKPOINT_BUCKETS):
                if checkpoint.save_s <= bound:
                    counts[i] += 1
    buckets = [(str(float(b)), float(c)) for b, c in zip(CHECKPOINT_BUCKETS, counts, strict=True)]
    buckets.append(("+Inf", float(n)))
    return HistogramMetricFamily(
        "rally_checkpoint_save_seconds",
        "Save time of each committed checkpoint still in the log's view (retention deletes drop out).",
        buckets=buckets,
        sum_value=total,
    )


class ClusterCollector(Collector):
    """Registers with a service's metrics registry; computes ``cluster_families`` at each scrape."""

    def __init__(
        self,
        state: Callable[[], ClusterState],
        queues: Sequence[Queue] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._queues = tuple(queues)
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        return cluster_families(self._state(), self._clock(), self._queues)
