"""Between the log's world and the core's: ClusterState -> Snapshot, Decisions -> events. Pure.

The scheduler service, `rally replay --decisions` and the tests all go through these two functions, so a
decision recomputed from the log sees exactly the snapshot the live scheduler saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rallypoint.core.cluster import ClusterModel
from rallypoint.core.types import (
    DEFAULT_PRIORITY_CLASSES,
    Decisions,
    Node,
    PendingJob,
    PriorityClass,
    Queue,
    Resize,
    RunningJob,
    Snapshot,
)
from rallypoint.events import (
    Event,
    GangBound,
    GangResized,
    GangsBound,
    JobQueued,
    JobRejected,
    PreemptionRequested,
    TaskPlacement,
    subjects,
)
from rallypoint.events.catalogue import share_milli
from rallypoint.state import ACTIVE, LAUNCHED, ClusterState, JobView, NodeView
from rallypoint.userusage import UserUsage, usage_rows

from .adapter import (
    affinity_groups,
    attempt_end,
    core_node,
    exceeds_cluster,
    exceeds_cluster_reason,
    pending_share,
    pending_time_limit,
)
from .pending import pending_writes, rejection_writes
from .writes import Write


def node_of(view: NodeView) -> Node:
    return core_node(
        view.node_id,
        rack=view.rack,
        spine=view.spine,
        gpu_type=view.gpu_type,
        gpus=[(gpu.index, gpu.nvlink_domain) for gpu in view.gpus],
        cpu_milli=view.cpu_milli,
        memory_mib=view.memory_mib,
        schedulable=view.schedulable,
        mig_gpus=tuple(gpu.index for gpu in view.gpus if gpu.mig),
        labels=tuple(sorted(view.labels.items())),
        taints=tuple(sorted(view.taints)),
        gpu_memory_mib=min((gpu.memory_mib for gpu in view.gpus), default=0),
    )


def held_placements(job: JobView) -> tuple[TaskPlacement, ...]:
    """The GPUs the job holds, as placements: a gang growing by a resize holds its new GPUs from the
    decision on (its new placements cover its old ones); a shrinking one holds its old placements until
    their ranks stop."""
    resize = job.resize
    if resize is not None and sum(len(p.gpus) for p in resize.placements) > job.bound_gpus:
        return resize.placements
    return job.placements


def running_of(job: JobView) -> RunningJob:
    start = job.started_at if job.started_at is not None else (job.bound_at or job.submitted_at)
    limit = job.spec.time_limit_s
    placements = held_placements(job)
    return RunningJob(
        id=job.job_id,
        team=job.spec.team,
        priority_class=job.spec.priority,
        gpus=sum(len(p.gpus) for p in placements),
        gpu_type=job.spec.gpu_type,
        placements=placements,
        start_time=start,
        expected_end=attempt_end(start, limit),
        min_gpus=job.spec.min_gpus,
        max_gpus=job.spec.max_gpus,
        gpu_step=job.spec.gpu_step,
        gpus_per_task=job.spec.gpus_per_task,
        submit_time=job.submitted_at,
        last_checkpoint=_checkpoint_since(job.last_checkpoint_at, start),
        last_preempted_at=job.last_preempted_at,
        preempting_for=job.preempt_for,
        attained_gpu_s=job.attained_gpu_s,
        cpu_milli=job.spec.cpu_milli,
        memory_mib=job.spec.memory_mib,
        gpu_milli=share_milli(job.spec, placements[0] if placements else None),
        mig_profile=job.spec.mig_profile,
        # a service or an interactive session is never preempted, whatever its class
        preemptible=job.spec.kind not in ("service", "interactive"),
        service=job.spec.kind == "service",
        affinity_groups=affinity_groups(job.spec.affinity),
    )


def _checkpoint_since(checkpoint_at: float | None, start: float) -> float | None:
    """The core counts a victim's lost work from its last checkpoint; one older than this attempt's start
    saves nothing of this attempt."""
    if checkpoint_at is None or checkpoint_at <= start:
        return None
    return checkpoint_at


def pending_of(job: JobView) -> PendingJob:
    spec = job.spec
    return PendingJob(
        id=job.job_id,
        team=spec.team,
        priority_class=spec.priority,
        gpus=spec.gpus,
        gpus_per_task=spec.gpus_per_task,
        submit_time=job.submitted_at,
        arrival=job.submitted_seq,
        time_limit_s=pending_time_limit(spec.time_limit_s),
        gpu_type=spec.gpu_type,
        gpu_types=spec.gpu_types,
        topology_required=spec.topology_required,
        topology_preferred=spec.topology_preferred,
        min_gpus=spec.min_gpus,
        max_gpus=spec.max_gpus,
        gpu_step=spec.gpu_step,
        name=spec.name,
        user=job.user,
        last_preempted_at=job.last_preempted_at,
        attained_gpu_s=job.attained_gpu_s,
        last_run_s=job.run_s,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        gpu_milli=pending_share(spec.gpu_milli, spec.gpu_memory_mib),
        gpu_memory_mib=spec.gpu_memory_mib,
        mig_profile=spec.mig_profile,
        node_selector=tuple(sorted(spec.node_selector.items())),
        service=spec.kind == "service",
        tolerations=spec.tolerations,
        affinity=spec.affinity,
    )


def build_snapshot(
    state: ClusterState,
    now: float,
    *,
    queues: Sequence[Queue] = (),
    priority_classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
) -> Snapshot:
    model = ClusterModel(node_of(state.nodes[k]) for k in sorted(state.nodes))
    for job in state.active_jobs():
        model.bind(running_of(job))
    pending = tuple(pending_of(j) for j in state.ready_jobs(now))
    return Snapshot(
        now=now,
        cluster=model,
        pending=pending,
        queues=tuple(queues),
        priority_classes=tuple(priority_classes),
        user_usage=user_usage_of(state, pending, now),
    )


def user_usage_of(state: ClusterState, pending: Iterable[PendingJob], now: float) -> tuple[UserUsage, ...]:
    """The service of the waiting jobs' users, from the fold's ledgers (``userusage``; the simulator
    hands the core the same rows from its own)."""
    users = state.users
    if not users:
        return ()
    return usage_rows(
        lambda team, user: users.get(team, {}).get(user), ((j.team, j.user) for j in pending), now
    )


def decision_writes(
    decisions: Decisions,
    state: ClusterState,
    *,
    epoch: int,
    policy_version: str,
    at: float,
    reasons: bool = True,
) -> list[Write]:
    """The appends that carry out a cycle's whole ``decisions``, in this order: binds (they matter), the
    resizes and preemption requests their preemptors wait for, then changed pending codes. One writer, one
    fence: the scheduler appends them all through its fenced tree, so a deposed leader loses all of a
    cycle's output.

    Message ids name the epoch: a retry by the same leader is deduplicated, but two leaders' decisions
    for the same job never are (the server would otherwise answer the loser "already stored").

    Pending reasons follow ``pending.pending_writes``: a changed code at once, changed numbers rate-limited,
    and a job that can never run rejected with the core's reason. ``reasons=False``: the rejections alone
    (a prediction's run forward: no decision reads a pending reason, and writing them costs a pass over
    every waiting job each cycle).
    """
    writes = bind_writes(decisions, state, epoch=epoch, policy_version=policy_version, at=at)
    writes.extend(resize_writes(decisions, state, epoch=epoch, policy_version=policy_version, at=at))
    writes.extend(preemption_writes(decisions, state, epoch=epoch, policy_version=policy_version, at=at))
    if reasons:
        writes.extend(pending_writes(decisions, state, epoch=epoch, policy_version=policy_version, at=at))
    else:
        writes.extend(rejection_writes(decisions, state, at=at))
    return writes


def bind_writes(
    decisions: Decisions, state: ClusterState, *, epoch: int, policy_version: str, at: float
) -> list[Write]:
    """The cycle's binds: one ``GangBound``, or several in one ``GangsBound`` (one message for every
    follower to receive instead of one per gang). Its message id names its first bind, which no other
    write of this epoch binds again: a retry of the same write is deduplicated; another is not."""
    binds = [
        GangBound(
            job_id=bind.job_id,
            attempt=state.jobs[bind.job_id].attempt + 1,
            epoch=epoch,
            placements=bind.placements,
            computed_at_seq=state.last_seq,
            policy_version=policy_version,
            now=decisions.now,
            at=at,
        )
        for bind in decisions.binds
    ]
    if not binds:
        return []
    first = binds[0]
    if len(binds) == 1:
        msg_id = f"{first.job_id}:{first.attempt}:GangBound:e{epoch}"
        return [Write(subject=subjects.bind(first.job_id), event=first, msg_id=msg_id)]
    msg_id = f"{first.job_id}:{first.attempt}:GangsBound:e{epoch}"
    return [Write(subject=subjects.BINDS, event=GangsBound(binds=tuple(binds)), msg_id=msg_id)]


def resized_placements(placements: tuple[TaskPlacement, ...], resize: Resize) -> tuple[TaskPlacement, ...]:
    """The whole gang after ``resize``: the tasks it keeps (in task order), then those it adds, numbered
    0..n-1 again (the new size relaunches as a new attempt with a new world)."""
    removed = {(p.node_id, p.task) for p in resize.remove}
    kept = [p for p in sorted(placements, key=lambda p: p.task) if (p.node_id, p.task) not in removed]
    tasks = [*kept, *resize.add]
    return tuple(TaskPlacement(task=i, node_id=p.node_id, gpus=p.gpus) for i, p in enumerate(tasks))


def resize_writes(
    decisions: Decisions,
    state: ClusterState,
    *,
    epoch: int,
    policy_version: str,
    at: float,
) -> list[Write]:
    """The core's resizes of running elastic gangs, as the next attempt's placements. A gang already
    stopping (preempted, or a resize under way) is not resized again: the core asks again each cycle until
    the fold shows the change."""
    writes: list[Write] = []
    for resize in decisions.resizes:
        job = state.jobs.get(resize.job_id)
        if job is None or job.state not in LAUNCHED or job.resize is not None or job.preempt_for is not None:
            continue
        attempt = job.attempt + 1
        event = GangResized(
            job_id=job.job_id,
            attempt=attempt,
            epoch=epoch,
            placements=resized_placements(job.placements, resize),
            gpus=resize.gpus,
            reason=resize.reason,
            computed_at_seq=state.last_seq,
            policy_version=policy_version,
            now=decisions.now,
            at=at,
        )
        writes.append(
            Write(
                subject=subjects.resize(job.job_id),
                event=event,
                msg_id=f"{job.job_id}:{attempt}:GangResized:e{epoch}",
            )
        )
    return writes


def preemption_writes(
    decisions: Decisions,
    state: ClusterState,
    *,
    epoch: int,
    policy_version: str,
    at: float,
) -> list[Write]:
    """Requests to stop the core's victims, as scheduler decisions; a victim already asked to stop is not
    asked twice."""
    writes: list[Write] = []
    for preemption in decisions.preemptions:
        victim = state.jobs.get(preemption.victim_id)
        if victim is None or victim.state not in ACTIVE or victim.preempt_for is not None:
            continue
        event = PreemptionRequested(
            job_id=victim.job_id,
            role="scheduler",
            attempt=victim.attempt,
            for_job=preemption.for_job,
            reason=preemption.reason,
            epoch=epoch,
            computed_at_seq=state.last_seq,
            policy_version=policy_version,
            now=decisions.now,
            at=at,
        )
        writes.append(
            Write(
                subject=subjects.preempt(victim.job_id),
                event=event,
                msg_id=f"{victim.job_id}:{victim.attempt}:PreemptionRequested:e{epoch}",
            )
        )
    return writes


def admission_writes(state: ClusterState, *, at: float) -> list[Write]:
    """Admit each newly submitted job into its team's queue, or reject it if it can never fit.

    Written on the scheduler's admission subject ``rally.queue.<id>``, not the fenced tree: each is idempotent
    by message id and the fold ignores a repeat, so a deposed leader that writes one late does no harm.
    """
    writes: list[Write] = []
    never = {j.job_id for j in jobs_that_can_never_fit(state)}
    total = state.total_gpus()
    for job in state.pending_jobs():
        if job.job_id in never:
            event: Event = JobRejected(
                job_id=job.job_id,
                field="gpus",
                at=at,
                reason=exceeds_cluster_reason(job.spec.gpus, total),
            )
            writes.append(
                Write(
                    subject=subjects.admission(job.job_id), event=event, msg_id=f"{job.job_id}:0:JobRejected"
                )
            )
        elif job.queue is None:
            event = JobQueued(job_id=job.job_id, queue=job.spec.team, at=at)
            writes.append(
                Write(subject=subjects.admission(job.job_id), event=event, msg_id=f"{job.job_id}:0:JobQueued")
            )
    return writes


def jobs_that_can_never_fit(state: ClusterState) -> Iterable[JobView]:
    """Pending jobs larger than every registered GPU together: rejected rather than left to wait forever
    (``adapter.exceeds_cluster``, the simulator's admission rule too)."""
    total = state.total_gpus()
    if total == 0:
        return []
    return [j for j in state.pending_jobs() if exceeds_cluster(j.spec.gpus, total)]
