"""Turn a bound gang into per-node launch commands carrying the torchrun contract. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from rallypoint.events import JobSpec, TaskPlacement
from rallypoint.protocol import LaunchTask, RankSpec

# Rendezvous ports are derived, not negotiated: every party computes the same port from the job
# attempt, and a new attempt gets a new port so a lingering old rank cannot join the new ring.
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 20000


def master_port(job_id: str, attempt: int) -> int:
    digest = hashlib.sha256(f"{job_id}:{attempt}".encode()).digest()
    return MASTER_PORT_BASE + int.from_bytes(digest[:4], "big") % MASTER_PORT_SPAN


def launch_plan(
    job_id: str,
    attempt: int,
    spec: JobSpec,
    placements: tuple[TaskPlacement, ...],
    addresses: Mapping[str, str],
) -> list[LaunchTask]:
    """One ``LaunchTask`` per task, ranks numbered task-major as torchrun does.

    RANK = NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK.
    """
    ordered = sorted(placements, key=lambda p: p.task)
    local_world = spec.ranks_per_task
    world = local_world * len(ordered)
    gpus_per_rank = spec.gpus_per_task // local_world
    master = addresses[ordered[0].node_id]
    port = master_port(job_id, attempt)
    tasks: list[LaunchTask] = []
    for placement in ordered:
        gpus = tuple(placement.gpus)
        ranks = tuple(
            RankSpec(
                rank=placement.task * local_world + local,
                local_rank=local,
                gpus=gpus[local * gpus_per_rank : (local + 1) * gpus_per_rank],
            )
            for local in range(local_world)
        )
        tasks.append(
            LaunchTask(
                job_id=job_id,
                attempt=attempt,
                node_id=placement.node_id,
                node_rank=placement.task,
                world_size=world,
                local_world_size=local_world,
                master_addr=master,
                master_port=port,
                ranks=ranks,
                command=spec.command,
                env=dict(spec.env),
            )
        )
    return tasks


def rank_environment(task: LaunchTask, rank: RankSpec) -> dict[str, str]:
    """The environment one rank process sees, on top of the agent's own."""
    env = dict(task.env)
    env.update(
        {
            "RALLY_JOB_ID": task.job_id,
            "RALLY_ATTEMPT": str(task.attempt),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in rank.gpus),
            "MASTER_ADDR": task.master_addr,
            "MASTER_PORT": str(task.master_port),
            "WORLD_SIZE": str(task.world_size),
            "RANK": str(rank.rank),
            "LOCAL_RANK": str(rank.local_rank),
            "LOCAL_WORLD_SIZE": str(task.local_world_size),
            "NODE_RANK": str(task.node_rank),
        }
    )
    return env
