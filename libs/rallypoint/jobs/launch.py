"""Turn a bound gang into per-node launch commands carrying the torchrun contract. Pure."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from typing import Protocol

from rallypoint.events import JobSpec, TaskPlacement
from rallypoint.events.catalogue import share_milli
from rallypoint.protocol import LaunchTask, RankSpec


class CheckpointRef(Protocol):
    """What a launch needs to know of the checkpoint to resume from (``state.CheckpointView``)."""

    @property
    def step(self) -> int: ...

    @property
    def path(self) -> str: ...


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
    *,
    extra_env: Mapping[str, str] | None = None,
) -> list[LaunchTask]:
    """One ``LaunchTask`` per task, ranks numbered task-major as torchrun does.

    RANK = NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK. ``extra_env`` (Rallypoint's own variables, such as
    the checkpoint contract) is laid over the job's ``env``.
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
                env={**spec.env, **(extra_env or {})},
                gpu_milli=share_milli(spec, placement) or 0,
                mig=placement.mig,
                pty=spec.kind == "interactive",
                ports=spec.ports,
            )
        )
    return tasks


def share_env(gpu_milli: int, gpu_memory_mib: int, asked_memory_mib: int | None = None) -> dict[str, str]:
    """What a fractional job's rank is told of its share: ``RALLY_GPU_MILLI``, and the limits a CUDA MPS
    client applies to itself: the share of the GPU's SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, rounded up
    to a whole percent) and of its memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for its one visible device:
    the GPU memory it asked for, else its share of the GPU's when that is known). Without an MPS daemon on
    the node they are advice the job may read, not a limit (``docs/sharing.md``, "Isolation")."""
    env = {
        "RALLY_GPU_MILLI": str(gpu_milli),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, -(-gpu_milli // 10))),
    }
    if asked_memory_mib is not None:
        env["RALLY_GPU_MEMORY_MIB"] = str(asked_memory_mib)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={asked_memory_mib}M"
    elif gpu_memory_mib > 0:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={gpu_memory_mib * gpu_milli // 1000}M"
    return env


#: What a rank inherits of its agent's environment: where programs and libraries are, the locale, the time
#: zone and the temporary folder. Nothing else: the agent's bus identity, tokens, DSNs and whatever else its
#: operator set stay with the agent (issue 30). A job that needs more says so in its own ``env``.
INHERITED_VARIABLES: frozenset[str] = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR"}
)
INHERITED_PREFIXES: tuple[str, ...] = ("LC_",)


def inherited_environment(agent_env: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of the agent's environment a rank starts from (``INHERITED_VARIABLES``)."""
    return {
        name: value
        for name, value in agent_env.items()
        if name in INHERITED_VARIABLES or name.startswith(INHERITED_PREFIXES)
    }


#: The torchrun contract ``rank_environment`` sets in every rank besides Rallypoint's ``RALLY_*`` names: no
#: job's variable may take one of these names (``validate.check_secrets``).
CONTRACT_VARIABLES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
    }
)


def rank_environment(
    task: LaunchTask, rank: RankSpec, agent_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of one rank process: the allow-listed base of the agent's (``agent_env``),
    the job's own ``env`` and its secrets, then the torchrun contract and Rallypoint's variables, which
    nothing overrides."""
    env = inherited_environment(agent_env or {})
    # CUDA numbers GPUs fastest-first by default; NVML (and so our GPU indices, placements and
    # CUDA_VISIBLE_DEVICES) numbers them in PCI bus order. Make CUDA agree, unless the job says otherwise.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(task.env)
    env.update(task.secrets)  # names validated apart from env's and the contract's: nothing to override
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


def checkpoint_dir_for(job_id: str, spec: JobSpec, root: str | None) -> str | None:
    """The job's checkpoint folder: the one it asked for, else ``root/<job id>``; the same on every rank
    and every attempt. None when neither exists (the job cannot checkpoint)."""
    if spec.checkpoint_dir:
        return spec.checkpoint_dir
    if root:
        return posixpath.join(root, job_id)
    return None


def checkpoint_env(
    job_id: str, spec: JobSpec, root: str | None, latest: CheckpointRef | None
) -> dict[str, str]:
    """``RALLY_CHECKPOINT_DIR`` and, when the log knows a complete checkpoint, what to resume from
    (the training client still verifies it and falls back to an older one if it must)."""
    env: dict[str, str] = {}
    folder = checkpoint_dir_for(job_id, spec, root)
    if folder is not None:
        env["RALLY_CHECKPOINT_DIR"] = folder
    if latest is not None:
        env["RALLY_RESUME_STEP"] = str(latest.step)
        env["RALLY_RESUME_PATH"] = latest.path
    return env
