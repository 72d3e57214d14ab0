"""The process's own Prometheus instruments: what happens inside one service, measured where it happens.

They live in prometheus-client's default registry (one per process: every service is its own process), so
a service's ``/metrics`` (``rallypoint.runtime.metrics``) exports them with the process and Python
collectors. Names follow Kueue's where the meaning is the same (``admission_wait_time_seconds``,
``admission_attempt_duration_seconds`` -> our cycle, ``preempted_workloads_total``).
Everything derivable from the log is computed at scrape time instead (``cluster``): counting it here too
would double it across replicas and restart it from zero with every process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import Counter, Histogram, disable_created_metrics

from rallypoint.events import GangBound, GangRepaired, JobRequeued, PreemptionRequested, subjects
from rallypoint.state import ClusterState

from .children import LabelChildren
from .decision_spans import trace_decision
from .jobtraces import JobTraces

# No `_created` samples (OpenMetrics' creation time, which prometheus-client adds to every counter and
# histogram): each doubled its family in the text format and nothing reads it. The switch is read at
# each scrape and holds for every instrument of the process, this module's and a service's own.
disable_created_metrics()

# Cycles take milliseconds on a small cluster and up to seconds at 100k GPUs.
_CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Queue waits run from sub-second (an idle cluster) to days.
_WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400)

SCHEDULER_CYCLE_SECONDS = Histogram(
    "rally_scheduler_cycle_duration_seconds",
    "Wall time of one scheduling cycle of the active scheduler (fold wait, decide, append).",
    ["result"],
    buckets=_CYCLE_BUCKETS,
)
SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS = Histogram(
    "rally_scheduler_cycle_compute_cpu_seconds",
    "CPU time of a deciding cycle's own computation (admissions, model sync, the core, the events to "
    "write), without the waits for the fold and the appends in between: what the cycle costs the process, "
    "however busy the machine is.",
    buckets=_CYCLE_BUCKETS,
)
SCHEDULER_WRITE_SECONDS = Histogram(
    "rally_scheduler_write_seconds",
    "Wall time of one fenced write of the active scheduler, as it sees it: its atomic batches encoded, "
    "sent and their acknowledgement taken by its loop (a cycle makes one or two).",
    buckets=_CYCLE_BUCKETS,
)
SCHEDULER_EVENTS_WRITTEN = Counter(
    "rally_scheduler_events_written",
    "Events the active scheduler's fenced writes stored: binds, preemption requests, pending reasons, "
    "admissions (each bind of a GangsBound counted). Over rally_scheduler_write_seconds' sum: the rate its "
    "writes store events at.",
)
SCHEDULER_CYCLES = Counter(
    "rally_scheduler_cycles", "Scheduling cycles run by this instance while it leads.", ["result"]
)
ADMISSION_WAIT_SECONDS = Histogram(
    "rally_admission_wait_time_seconds",
    "Seconds from a job's submission to the bind of its gang (Kueue admission_wait_time_seconds).",
    ["team", "priority"],
    buckets=_WAIT_BUCKETS,
)
ADMITTED_WORKLOADS = Counter(
    "rally_admitted_workloads",
    "Gangs bound by this scheduler instance (Kueue admitted_workloads_total).",
    ["team"],
)
PREEMPTIONS_REQUESTED = Counter(
    "rally_preempted_workloads",
    "Preemptions this scheduler decided, by reason: reclaim, priority, las (Kueue preempted_workloads).",
    ["reason"],
)
GANG_RECOVERIES = Counter(
    "rally_gang_recoveries",
    "Interrupted gangs this scheduler dealt with: repaired in place, shrunk (elastic) or requeued.",
    ["outcome"],
)
HEARTBEATS_RECEIVED = Counter(
    "rally_heartbeats_received", "Node heartbeats this health monitor received (decoded or not).", ["result"]
)
HEARTBEATS_SENT = Counter("rally_agent_heartbeats_sent", "Heartbeats this node agent published.")
RANK_LAUNCHES = Counter("rally_agent_rank_launches", "Launch commands this node agent served.", ["result"])
JOB_CONTROLLER_ACTIONS = Counter(
    "rally_job_controller_actions", "Actions the job controller carried out, by kind.", ["action"]
)

# A counter whose label values are a closed set starts each series at 0: otherwise a series appears only
# at its first event, at 1, and an alert on increase() or rate() never sees that first one.
_CLOSED_LABELS: tuple[tuple[Counter, str, tuple[str, ...]], ...] = (
    (SCHEDULER_CYCLES, "result", ("appended", "idle", "error")),
    (GANG_RECOVERIES, "outcome", ("repaired", "shrunk", "requeued")),
    (HEARTBEATS_RECEIVED, "result", ("ok", "undecodable")),
    (RANK_LAUNCHES, "result", ("started", "already_running")),
)
for _counter, _label, _values in _CLOSED_LABELS:
    for _value in _values:
        _counter.labels(**{_label: _value})


def observe_writes(
    events: Iterable[object], state: ClusterState, now: float, traces: JobTraces | None = None
) -> None:
    """Count what one scheduler cycle appended: binds (with each job's wait), preemptions, recoveries;
    with ``traces``, record their spans in each job's trace too."""
    for event in (member for written in events for member in subjects.members(written)):
        observe = _OBSERVERS.get(type(event))
        if observe is not None:
            observe(event, state, now)
            if traces is not None:
                trace_decision(event, state, traces, now)


_admitted = LabelChildren(ADMITTED_WORKLOADS)
_admission_waits = LabelChildren(ADMISSION_WAIT_SECONDS)


def _bound(event: object, state: ClusterState, now: float) -> None:
    assert isinstance(event, GangBound)
    job = state.jobs.get(event.job_id)
    if job is None:
        return
    team = job.spec.team
    _admitted.get(team).inc()
    # A retried or preempted job waits again: its wait counts from submission, what the user sees.
    _admission_waits.get(team, job.spec.priority).observe(max(0.0, now - job.submitted_at))


def _preempted(event: object, _state: ClusterState, _now: float) -> None:
    assert isinstance(event, PreemptionRequested)
    PREEMPTIONS_REQUESTED.labels(reason=event.reason).inc()


def _repaired(event: object, _state: ClusterState, _now: float) -> None:
    assert isinstance(event, GangRepaired)
    GANG_RECOVERIES.labels(outcome="shrunk" if event.shrunk else "repaired").inc()


def _requeued(_event: object, _state: ClusterState, _now: float) -> None:
    GANG_RECOVERIES.labels(outcome="requeued").inc()


_OBSERVERS: dict[type, Callable[[object, ClusterState, float], None]] = {
    GangBound: _bound,
    PreemptionRequested: _preempted,
    GangRepaired: _repaired,
    JobRequeued: _requeued,
}
