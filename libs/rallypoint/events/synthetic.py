"""Synthetic cluster histories for the benches: nodes registering, and jobs living a whole short life.

What the log of a busy cluster holds per job (submitted, queued, bound, started, each rank's exit,
completed), built without a cluster, so a bench can time following, folding or projecting it. Each event
goes on the subject ``subjects.for_event`` gives it.
"""

from __future__ import annotations

from .catalogue import (
    Event,
    GangBound,
    GpuInfo,
    JobCompleted,
    JobQueued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    RankExited,
    TaskPlacement,
)

GPUS_PER_NODE = 8
NODES_PER_RACK = 32


def registered_node(i: int, *, at: float, gpus_per_node: int = GPUS_PER_NODE) -> NodeRegistered:
    """Node ``i`` of a fleet of 8-GPU (H100-like) nodes, 32 to a rack, registering at ``at``."""
    node_id = node_name(i)
    gpus = tuple(
        GpuInfo(index=g, uuid=f"{node_id}-gpu{g}", memory_mib=81559, nvlink_domain=0)
        for g in range(gpus_per_node)
    )
    return NodeRegistered(
        node_id=node_id,
        address=f"10.0.{i // 256}.{i % 256}:7070",
        rack=f"rack-{i // NODES_PER_RACK}",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=96_000,
        memory_mib=1 << 20,
        agent_instance=f"{node_id}-agent",
        at=at,
    )


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def job_life(
    job_id: str, *, node_id: str, gpus: tuple[int, ...], ranks: int, at: float, run_s: float
) -> list[list[Event]]:
    """One job on one node, phase by phase (a phase's events may land in any order among themselves):
    submitted at ``at``, queued 10 ms later, bound at 100 ms, started at 200 ms, its ranks exiting after
    ``run_s`` and the job completed 100 ms after that."""
    spec = JobSpec(
        name=job_id,
        team="bench",
        gpus=len(gpus),
        gpus_per_task=len(gpus),
        ranks_per_task=ranks,
        command=("sleep", str(run_s)),
    )
    bound = GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=(TaskPlacement(task=0, node_id=node_id, gpus=gpus),),
        computed_at_seq=1,
        policy_version="bench",
        now=at + 0.1,
        at=at + 0.1,
    )
    end = at + run_s
    exits: list[Event] = [
        RankExited(job_id=job_id, attempt=1, rank=r, node_id=node_id, exit_code=0, at=end)
        for r in range(ranks)
    ]
    return [
        [JobSubmitted(job_id=job_id, spec=spec, submitted_at=at)],
        [JobQueued(job_id=job_id, queue="bench", at=at + 0.01)],
        [bound],
        [JobStarted(job_id=job_id, attempt=1, at=at + 0.2)],
        exits,
        [JobCompleted(job_id=job_id, attempt=1, at=end + 0.1)],
    ]
