"""The job controller's decisions, as a pure function of the folded state and the time.

Level-triggered, like a Kubernetes controller: ``reconcile(job, state, now)`` looks at what the log says
a job *is* and returns what must happen to make the world match. Nothing is remembered between calls,
so a controller that was killed and restarted simply reconciles again; every action is idempotent
(agents dedupe launches by job/attempt/rank, appends carry a Nats-Msg-Id and the fold ignores repeats).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from rallypoint.events import Event, JobCancelled, JobCompleted, JobFailed, JobPreempted, JobStarted, subjects
from rallypoint.jobs.launch import launch_plan
from rallypoint.protocol import LaunchTask
from rallypoint.state import ClusterState, JobView


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """Send these launch commands; when every one is acknowledged, append ``then``."""

    tasks: tuple[LaunchTask, ...]
    then: JobStarted


class Kill(msgspec.Struct, frozen=True, kw_only=True):
    """Stop every rank of (job, attempt) on these nodes, then append ``then`` (if any).

    ``await_exits``: append ``then`` only once every rank has reported its exit (or the grace period
    and a margin have passed), so GPUs are never handed to the next job while old ranks still hold them.
    """

    job_id: str
    attempt: int
    node_ids: tuple[str, ...]
    then: Event | None
    grace_s: float = 5.0
    await_exits: bool = False


class Append(msgspec.Struct, frozen=True, kw_only=True):
    event: Event


Action = Launch | Kill | Append


def msg_id_for(job: JobView, event: Event) -> str:
    """One id per (job, attempt, event type): a retried append is stored once, a new attempt is new."""
    return f"{job.job_id}:{job.attempt}:{type(event).__name__}"


def subject_for(job: JobView) -> str:
    return subjects.job(job.job_id)


def _nodes_of(job: JobView) -> tuple[str, ...]:
    return tuple(sorted({p.node_id for p in job.placements}))


def _first_failure(job: JobView) -> tuple[int, int] | None:
    failures = sorted((rank, code) for rank, code in job.ranks_exited.items() if code != 0)
    return failures[0] if failures else None


def _lost_node(job: JobView, state: ClusterState) -> str | None:
    for node_id in _nodes_of(job):
        node = state.nodes.get(node_id)
        if node is None or node.status == "lost":
            return node_id
    return None


# Preempted ranks get this long after SIGTERM to write a checkpoint before SIGKILL.
PREEMPTION_GRACE_S = 30.0


def reconcile(
    job: JobView, state: ClusterState, now: float, *, preemption_grace_s: float = PREEMPTION_GRACE_S
) -> list[Action]:
    """What must happen to ``job`` now. Empty when nothing does."""
    if job.terminal:
        return []
    if job.state == "pending":
        if job.cancel_requested:
            return [Append(event=JobCancelled(job_id=job.job_id, attempt=None, at=now))]
        return []

    attempt = job.attempt
    nodes = _nodes_of(job)
    if job.cancel_requested:
        return [
            Kill(
                job_id=job.job_id,
                attempt=attempt,
                node_ids=nodes,
                then=JobCancelled(job_id=job.job_id, attempt=attempt, at=now),
            )
        ]

    if job.preempt_for is not None:
        preempted = JobPreempted(
            job_id=job.job_id, attempt=attempt, for_job=job.preempt_for, reason=job.preempt_reason, at=now
        )
        return [
            Kill(
                job_id=job.job_id,
                attempt=attempt,
                node_ids=nodes,
                then=preempted,
                grace_s=preemption_grace_s,
                await_exits=True,
            )
        ]

    failure = _first_failure(job)
    if failure is not None:
        rank, code = failure
        failed = JobFailed(
            job_id=job.job_id,
            attempt=attempt,
            reason=f"rank {rank} exited with code {code}",
            exit_code=code,
            at=now,
        )
        return [Kill(job_id=job.job_id, attempt=attempt, node_ids=nodes, then=failed)]

    lost = _lost_node(job, state)
    if lost is not None:
        failed = JobFailed(job_id=job.job_id, attempt=attempt, reason=f"node {lost} was lost", at=now)
        return [Kill(job_id=job.job_id, attempt=attempt, node_ids=nodes, then=failed)]

    if len(job.ranks_exited) >= job.world_size:
        return [Append(event=JobCompleted(job_id=job.job_id, attempt=attempt, at=now))]

    limit = job.spec.time_limit_s
    if (
        job.state == "running"
        and limit is not None
        and job.started_at is not None
        and now > job.started_at + limit
    ):
        failed = JobFailed(
            job_id=job.job_id, attempt=attempt, reason=f"time limit of {limit} s exceeded", at=now
        )
        return [Kill(job_id=job.job_id, attempt=attempt, node_ids=nodes, then=failed)]

    if job.state == "bound":
        addresses = _addresses(state, nodes)
        tasks = launch_plan(job.job_id, attempt, job.spec, job.placements, addresses)
        return [Launch(tasks=tuple(tasks), then=JobStarted(job_id=job.job_id, attempt=attempt, at=now))]
    return []


def _addresses(state: ClusterState, node_ids: tuple[str, ...]) -> Mapping[str, str]:
    return {n: state.nodes[n].address for n in node_ids if n in state.nodes}


def owned_by(job_id: str, shard: int, shards: int) -> bool:
    """Stable job partitioning for running several controllers side by side."""
    if shards <= 1:
        return True
    digest = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    return digest % shards == shard
