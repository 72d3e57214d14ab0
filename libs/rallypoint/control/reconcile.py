"""The job controller's decisions, as a pure function of the folded state and the time.

Level-triggered, like a Kubernetes controller: ``reconcile(job, state, now)`` looks at what the log says
a job *is* and returns what must happen to make the world match. Nothing is remembered between calls,
so a controller that was killed and restarted simply reconciles again; every action is idempotent
(agents dedupe launches by job/attempt/rank, appends carry a Nats-Msg-Id and the fold ignores repeats).

Failures are classified before they are acted on (``rallypoint.control.recovery``):
- **infrastructure** (a node under the gang lost or drained, a rank lost with its agent): the healthy
  nodes keep their GPUs and the scheduler swaps in a replacement (``JobInterrupted``); it never uses up
  the user's ``max_retries``, only its own cap;
- **user** (a rank exited non-zero on a healthy node): retried up to ``max_retries`` with exponential
  backoff (``JobAttemptFailed``), then ``JobFailed`` naming every attempt;
- **time limit** and **cancel** end the job.
An elastic gang's resize (``GangResized``) is a checkpoint-restart at the new size: every rank gets SIGTERM
and the preemption grace to checkpoint, and once all have exited ``JobResized`` frees the GPUs the resize
drops; the new size then launches as the resize's attempt.
Every restart resumes from the job's latest complete checkpoint (``RALLY_RESUME_STEP``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from rallypoint.events import (
    Event,
    JobAttemptFailed,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobInterrupted,
    JobPreempted,
    JobResized,
    JobStarted,
    JobSuspended,
    TaskPlacement,
    subjects,
)
from rallypoint.events.catalogue import share_milli
from rallypoint.jobs.arrays import array_env
from rallypoint.jobs.launch import checkpoint_env, launch_plan, share_env
from rallypoint.protocol import LaunchTask
from rallypoint.state import LAUNCHED, ClusterState, JobView
from rallypoint.state.dependencies import never_met

from .recovery import RecoveryConfig, classify_failure, eviction_wake_at, failure_events, user_outcome

__all__ = [
    "PREEMPTION_GRACE_S",
    "Action",
    "Append",
    "Kill",
    "Launch",
    "RecoveryConfig",
    "msg_id_for",
    "owned_by",
    "reconcile",
    "subject_for",
    "wake_at",
    "with_lost_work",
]


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """Send these launch commands; when every one is acknowledged, append ``then``."""

    tasks: tuple[LaunchTask, ...]
    then: JobStarted


class Kill(msgspec.Struct, frozen=True, kw_only=True):
    """Stop every rank of (job, attempt) on these nodes, then append ``then`` (if any).

    ``await_ranks``: append ``then`` only once each of these ranks has reported its exit (or the grace
    period and a margin have passed), so GPUs are never handed on while old ranks still hold them, and a
    checkpoint written in the grace period is in the log before the lost work is counted.
    """

    job_id: str
    attempt: int
    node_ids: tuple[str, ...]
    then: Event | None
    grace_s: float = 5.0
    await_ranks: tuple[int, ...] = ()


class Append(msgspec.Struct, frozen=True, kw_only=True):
    event: Event


Action = Launch | Kill | Append


def msg_id_for(job: JobView, event: Event) -> str:
    """One id per (job, attempt, event type): a retried append is stored once, a new attempt is new."""
    return f"{job.job_id}:{job.attempt}:{type(event).__name__}"


def subject_for(job: JobView) -> str:
    """The job controller's own branch: the API, which writes ``rally.job.<id>``, cannot forge these."""
    return subjects.job_control(job.job_id)


def _nodes_of(job: JobView) -> tuple[str, ...]:
    return tuple(sorted({p.node_id for p in job.placements}))


def ranks_on(job: JobView, node_ids: tuple[str, ...]) -> tuple[int, ...]:
    """The rank numbers the job's current attempt runs on ``node_ids`` (task-major, as launched)."""
    per_task = job.spec.ranks_per_task
    wanted = set(node_ids)
    return tuple(
        sorted(
            p.task * per_task + local
            for p in job.placements
            if p.node_id in wanted
            for local in range(per_task)
        )
    )


# Preempted ranks get this long after SIGTERM to write a checkpoint before SIGKILL.
PREEMPTION_GRACE_S = 30.0


def reconcile(
    job: JobView,
    state: ClusterState,
    now: float,
    *,
    preemption_grace_s: float = PREEMPTION_GRACE_S,
    recovery: RecoveryConfig | None = None,
) -> list[Action]:
    """What must happen to ``job`` now. Empty when nothing does."""
    config = recovery if recovery is not None else RecoveryConfig()
    if job.terminal:
        return []
    if job.state in ("pending", "suspended"):
        if job.cancel_requested:
            return [Append(event=JobCancelled(job_id=job.job_id, attempt=None, at=now))]
        if job.suspend_requested:  # nothing runs: suspended at once
            return [Append(event=JobSuspended(job_id=job.job_id, attempt=None, at=now))]
        if job.state == "suspended":
            return []  # waits for a resume
        unmet = never_met(job, state.jobs) if job.spec.depends_on else None
        if unmet is not None:  # it would wait forever: end it, saying which dependency
            return [Append(event=JobFailed(job_id=job.job_id, attempt=job.attempt, reason=unmet, at=now))]
        return []
    if job.cancel_requested:
        return [_kill_then(job, JobCancelled(job_id=job.job_id, attempt=job.attempt, at=now))]
    if job.suspend_requested:  # as a preemption: the grace to checkpoint, then every rank stopped
        suspended = JobSuspended(job_id=job.job_id, attempt=job.attempt, at=now)
        return [_kill_then(job, suspended, grace_s=preemption_grace_s, awaited=True)]
    if job.preempt_for is not None:
        return [_preempt(job, now, preemption_grace_s)]
    if job.resize is not None and job.state in LAUNCHED:
        # before the completion rule: ranks stopped by the resize's SIGTERM do not finish the job
        resized = JobResized(job_id=job.job_id, attempt=job.attempt, at=now)
        return [_kill_then(job, resized, grace_s=preemption_grace_s, awaited=True)]
    if job.state == "repairing":
        return []  # the scheduler swaps in a replacement node or requeues the gang
    return _reconcile_launched(job, state, now, config)


def wake_at(
    job: JobView, state: ClusterState | None = None, config: RecoveryConfig | None = None
) -> float | None:
    """When ``reconcile(job, ...)`` may start asking for something without any event about the job or its
    nodes (None: never). A controller that reconciles only what changed must look again then.

    Two rules depend on the clock: the time limit, and a drain that waits for the gang's next checkpoint
    up to a deadline (given ``state``). Every other rule reads the job and its nodes, which only
    events change (a silent node's verdict, a cancel, a preemption, exits), and the waits that do take
    time (the preemption grace, a kill's wait for its ranks, a retry's backoff, a repair's wait for a
    node) are kept by the controller's own action or by the scheduler, not by this function.
    """
    times: list[float] = []
    limit = job.spec.time_limit_s
    if job.state == "running" and limit is not None and job.started_at is not None:
        times.append(job.started_at + limit)
    if state is not None and job.state in LAUNCHED:
        # a drain that waits for the gang's next checkpoint gives up at a deadline nothing else announces
        drain = (config if config is not None else RecoveryConfig()).drain
        if (due := eviction_wake_at(job, state, drain)) is not None:
            times.append(due)
    return min(times, default=None)


def _kill_then(job: JobView, then: Event, *, grace_s: float = 5.0, awaited: bool = False) -> Kill:
    nodes = _nodes_of(job)
    waits = ranks_on(job, nodes) if awaited and job.state in LAUNCHED else ()
    return Kill(
        job_id=job.job_id, attempt=job.attempt, node_ids=nodes, then=then, grace_s=grace_s, await_ranks=waits
    )


def _preempt(job: JobView, now: float, grace_s: float) -> Kill:
    preempted = JobPreempted(
        job_id=job.job_id,
        attempt=job.attempt,
        for_job=job.preempt_for or "",
        reason=job.preempt_reason,
        at=now,
    )
    return _kill_then(job, preempted, grace_s=grace_s, awaited=True)


def _reconcile_launched(
    job: JobView, state: ClusterState, now: float, config: RecoveryConfig
) -> list[Action]:
    failure = classify_failure(job, state, now, config.drain)
    if failure == "wait":
        return []  # a node of the gang is silent: do not blame the user before the node is judged
    if failure is not None:
        then, failed_nodes = failure_events(job, failure, now, config)
        healthy = tuple(n for n in _nodes_of(job) if n not in failed_nodes)
        # every rank stops (the healthy ones relaunch with a fresh rendezvous); wait only for the ranks
        # that can still report. A lost node's agent cannot answer (a kill would only wait out its
        # timeout): its ranks are killed when it comes back, before it is used again.
        reachable = tuple(n for n in _nodes_of(job) if n in state.nodes and state.nodes[n].status != "lost")
        return [
            Kill(
                job_id=job.job_id,
                attempt=job.attempt,
                node_ids=reachable,
                then=then,
                grace_s=config.failure_grace_s,
                await_ranks=ranks_on(job, healthy),
            )
        ]
    if len(job.ranks_exited) >= job.world_size:
        if job.spec.kind == "service":  # a service never completes: it starts again, after the backoff
            what = "every rank of the service exited; restarting it"
            return [Append(event=user_outcome(job, what, 0, now, config))]
        return [Append(event=JobCompleted(job_id=job.job_id, attempt=job.attempt, at=now))]
    limit = job.spec.time_limit_s
    if (
        job.state == "running"
        and limit is not None
        and job.started_at is not None
        and now > job.started_at + limit
    ):
        failed = JobFailed(
            job_id=job.job_id, attempt=job.attempt, reason=f"time limit of {limit} s exceeded", at=now
        )
        return [_kill_then(job, failed)]
    if job.state == "bound":
        return [_launch(job, state, now, config)]
    return []


def _launch(job: JobView, state: ClusterState, now: float, config: RecoveryConfig) -> Launch:
    nodes = _nodes_of(job)
    latest = job.latest_checkpoint()
    env = {**checkpoint_env(job.job_id, job.spec, config.checkpoint_root, latest), **array_env(job.spec)}
    milli = share_milli(job.spec, job.placements[0]) if job.placements else None
    if milli is not None:
        env.update(share_env(milli, _gpu_memory(state, job.placements[0]), job.spec.gpu_memory_mib))
    tasks = launch_plan(
        job.job_id, job.attempt, job.spec, job.placements, _addresses(state, nodes), extra_env=env
    )
    started = JobStarted(
        job_id=job.job_id,
        attempt=job.attempt,
        resume_step=latest.step if latest is not None else None,
        at=now,
    )
    return Launch(tasks=tuple(tasks), then=started)


def _gpu_memory(state: ClusterState, placement: TaskPlacement) -> int:
    """MiB of the placement's first GPU as its node registered it (0: unknown)."""
    node = state.nodes.get(placement.node_id)
    if node is None or not placement.gpus:
        return 0
    return next((g.memory_mib for g in node.gpus if g.index == placement.gpus[0]), 0)


def _addresses(state: ClusterState, node_ids: tuple[str, ...]) -> Mapping[str, str]:
    return {n: state.nodes[n].address for n in node_ids if n in state.nodes}


def with_lost_work(event: Event, job: JobView, at: float) -> Event:
    """``event`` with the work its attempt loses, counted at ``at`` (once every rank has stopped, so a
    checkpoint written in the grace period counts): GPUs held x seconds since the attempt's newest
    complete checkpoint or, when it has none, since it started. Other events pass unchanged."""
    if not isinstance(event, JobPreempted | JobAttemptFailed | JobInterrupted | JobResized | JobSuspended):
        return event
    latest = job.latest_checkpoint()
    since = job.started_at
    if since is not None and job.last_checkpoint_at is not None:
        since = max(since, job.last_checkpoint_at)
    lost = 0.0 if since is None else max(0.0, at - since) * job.bound_gpus
    step = latest.step if latest is not None else None
    return msgspec.structs.replace(event, lost_gpu_s=round(lost, 3), checkpoint_step=step, at=at)


def owned_by(job_id: str, shard: int, shards: int) -> bool:
    """Stable job partitioning for running several controllers side by side."""
    if shards <= 1:
        return True
    digest = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    return digest % shards == shard
