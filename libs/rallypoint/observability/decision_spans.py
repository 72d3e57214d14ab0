"""The scheduler's spans in each job's trace: how long it queued, its bind, and each recovery of its gang.

Recorded after the fact from the cycle's writes (the wait is known only when it ends), parented on the
job's submission (``JobTraces``).
"""

from __future__ import annotations

from rallypoint.events import GangBound, GangRepaired, JobRequeued
from rallypoint.state import ClusterState

from .jobtraces import JobTraces
from .tracing import enabled, record_span


def trace_decision(event: object, state: ClusterState, traces: JobTraces, now: float) -> None:
    if not enabled() or not isinstance(event, GangBound | GangRepaired | JobRequeued):
        return
    job = state.jobs.get(event.job_id)
    if job is None:
        return
    parent = traces.context(event.job_id)
    attributes = {"rally.job_id": event.job_id, "rally.team": job.spec.team, "rally.attempt": event.attempt}
    if isinstance(event, GangBound):
        record_span("queued", parent, start_s=job.submitted_at, end_s=now, attributes=attributes)
        nodes = sorted({p.node_id for p in event.placements})
        record_span("bind", parent, start_s=now, end_s=now, attributes={**attributes, "rally.nodes": nodes})
        return
    # A recovery is its own span: from the interruption to the repair (or the requeue that gave up).
    outcome = "requeued" if isinstance(event, JobRequeued) else "shrunk" if event.shrunk else "repaired"
    swaps = [f"{s.from_node}->{s.to_node}" for s in event.swaps] if isinstance(event, GangRepaired) else []
    record_span(
        "recovery",
        parent,
        start_s=traces.interrupted_at.pop(event.job_id, now),
        end_s=now,
        attributes={**attributes, "rally.outcome": outcome, "rally.swaps": swaps},
    )
