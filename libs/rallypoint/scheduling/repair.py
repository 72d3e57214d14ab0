"""The scheduler's decisions for interrupted gangs: swap in a replacement node, shrink, or requeue. Pure.

A gang whose node failed keeps its healthy nodes' GPUs (``repairing``). Each cycle, before new work is
placed, the scheduler looks for replacement nodes for its missing tasks (``core.repair``): found, the
gang is whole again as a new attempt (``GangRepaired``, the swaps named). Not found within
``repair_wait_s`` of the interruption: an elastic gang whose healthy part still meets its ``min_gpus``
shrinks to it; any other gang gives its GPUs back and waits in the queue at its original place
(``JobRequeued``), where the core may preempt lower-priority work for it like for any pending gang.
"""

from __future__ import annotations

from functools import partial

from rallypoint.core.cluster import ClusterModel
from rallypoint.core.constraints import node_admits
from rallypoint.core.repair import place_replacements, renumbered
from rallypoint.events import Event, GangRepaired, JobRequeued, NodeSwap, TaskPlacement, subjects
from rallypoint.state import ClusterState, JobView

from .bridge import Write

#: How long an interrupted gang holds its healthy nodes while no replacement is free.
REPAIR_WAIT_S = 60.0


def repair_writes(
    state: ClusterState,
    model: ClusterModel,
    now: float,
    *,
    epoch: int,
    policy_version: str,
    at: float,
    repair_wait_s: float = REPAIR_WAIT_S,
) -> list[Write]:
    """One write per interrupted gang that can be repaired, shrunk or must be requeued now.

    ``model`` is the cluster as ``state`` holds it (the survivors' GPUs bound); replacements found for
    one gang are taken out of it for the next, in arrival order, so two repairs never share a GPU.
    """
    writes: list[Write] = []
    taken: dict[str, set[int]] = {}
    for job in state.repairing_jobs():
        event = _decide(job, state, model, now, repair_wait_s, taken, epoch, policy_version, at)
        if event is None:
            continue
        if isinstance(event, GangRepaired):
            kept = {(p.node_id, p.task) for p in job.placements}
            for p in event.placements:
                if (p.node_id, p.task) not in kept:
                    taken.setdefault(p.node_id, set()).update(p.gpus)
            msg_id = f"{job.job_id}:{event.attempt}:GangRepaired:e{epoch}"
        else:
            msg_id = f"{job.job_id}:{job.attempt}:JobRequeued:e{epoch}"
        writes.append(Write(subject=subjects.repair(job.job_id), event=event, msg_id=msg_id))
    return writes


def _gpu_type(job: JobView, state: ClusterState) -> str | None:
    for placement in job.placements:
        node = state.nodes.get(placement.node_id)
        if node is not None:
            return node.gpu_type
    return job.spec.gpu_type


def _decide(
    job: JobView,
    state: ClusterState,
    model: ClusterModel,
    now: float,
    repair_wait_s: float,
    taken: dict[str, set[int]],
    epoch: int,
    policy_version: str,
    at: float,
) -> Event | None:
    gpu_type = _gpu_type(job, state)
    found = None
    if gpu_type is not None:
        found = place_replacements(
            model,
            job.placements,
            job.missing_tasks,
            job.spec.gpus_per_task,
            gpu_type,
            excluded=job.failed_nodes,
            taken=taken,
            admits=partial(
                node_admits, node_selector=job.spec.node_selector.items(), tolerations=job.spec.tolerations
            ),
        )
    if found is not None:
        return _repaired(job, state, found, epoch, policy_version, now, at)
    waited = now - (job.interrupted_at if job.interrupted_at is not None else now)
    if waited < repair_wait_s:
        return None
    failed = ", ".join(job.failed_nodes) or "the failed node"
    if job.spec.min_gpus is not None and job.placements and job.bound_gpus >= job.spec.min_gpus:
        return GangRepaired(
            job_id=job.job_id,
            attempt=job.attempt + 1,
            epoch=epoch,
            placements=renumbered(job.placements),
            shrunk=True,
            computed_at_seq=state.last_seq,
            policy_version=policy_version,
            now=now,
            at=at,
        )
    reason = f"no replacement for {failed} within {repair_wait_s:.0f} s; requeued at its place in the queue"
    return JobRequeued(
        job_id=job.job_id,
        attempt=job.attempt,
        reason=reason,
        epoch=epoch,
        computed_at_seq=state.last_seq,
        now=now,
        at=at,
    )


def _repaired(
    job: JobView,
    state: ClusterState,
    found: tuple[TaskPlacement, ...],
    epoch: int,
    policy_version: str,
    now: float,
    at: float,
) -> GangRepaired:
    failed_by_task = _failed_node_of_task(job)
    swaps = tuple(
        NodeSwap(task=p.task, from_node=failed_by_task.get(p.task, ""), to_node=p.node_id) for p in found
    )
    return GangRepaired(
        job_id=job.job_id,
        attempt=job.attempt + 1,
        epoch=epoch,
        placements=tuple(sorted((*job.placements, *found), key=lambda p: p.task)),
        swaps=swaps,
        computed_at_seq=state.last_seq,
        policy_version=policy_version,
        now=now,
        at=at,
    )


def _failed_node_of_task(job: JobView) -> dict[int, str]:
    """Which failed node each missing task ran on: the failed nodes in order, one per missing task when
    the counts match, else the first failed node (the log keeps the exact old placement anyway)."""
    if len(job.failed_nodes) == len(job.missing_tasks):
        return dict(zip(job.missing_tasks, job.failed_nodes, strict=True))
    first = job.failed_nodes[0] if job.failed_nodes else ""
    return dict.fromkeys(job.missing_tasks, first)
