"""The rules between the world and the core that the simulator and the live scheduler share. Pure.

The simulator keeps its world in its own objects and the scheduler in the fold (``bridge.py`` reads it), but
each rule that turns a fact of the world into a core input, or a core output into a fate of a job, lives
here once, and both call it: tests/sim/test_twin.py runs one workload through both and checks that the
core's decisions come out byte for byte the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from rallypoint.core.types import Affinity, Node
from rallypoint.state import ClusterState


def exceeds_cluster(gpus: int, total_gpus: int) -> bool:
    """Admission's rule: a gang asking for more GPUs than every registered node holds together can never
    run, and is rejected when it arrives, before the core ever sees it. Nothing is judged before the first
    node registers (a cluster starting up is not a small cluster)."""
    return total_gpus > 0 and gpus > total_gpus


def exceeds_cluster_reason(gpus: int, total_gpus: int) -> str:
    return f"asks for {gpus} GPUs; the cluster has {total_gpus}"


def nvlink_domains(gpus: Sequence[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """The core's NVLink domains from ``(GPU index, its domain number)`` pairs: the GPU indices of each
    domain, in domain order; ``()`` when one domain holds every GPU (the core's whole-board default), so a
    node reads the same whether its inventory names one domain or none."""
    groups: dict[int, list[int]] = {}
    for index, domain in gpus:
        groups.setdefault(domain, []).append(index)
    if len(groups) <= 1:
        return ()
    return tuple(tuple(sorted(g)) for _, g in sorted(groups.items()))


def core_node(
    node_id: str,
    *,
    rack: str,
    spine: str,
    gpu_type: str,
    gpus: Sequence[tuple[int, int]],
    cpu_milli: int,
    memory_mib: int,
    schedulable: bool = True,
    mig_gpus: tuple[int, ...] = (),
    labels: tuple[tuple[str, str], ...] = (),
    taints: tuple[str, ...] = (),
    gpu_memory_mib: int = 0,
) -> Node:
    """One machine as the core sees it; ``gpus`` as for ``nvlink_domains``; ``mig_gpus`` in MIG mode."""
    return Node(
        id=node_id,
        rack=rack,
        spine=spine,
        gpu_type=gpu_type,
        gpus=len(gpus),
        nvlink_domains=nvlink_domains(gpus),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        schedulable=schedulable,
        mig_gpus=mig_gpus,
        labels=labels,
        taints=taints,
        gpu_memory_mib=gpu_memory_mib,
    )


def affinity_groups(rules: Sequence[Affinity]) -> tuple[str, ...]:
    """The groups a job with these affinity rules is a member of, each once, sorted."""
    return tuple(sorted({rule.group for rule in rules}))


def pending_share(gpu_milli: int | None, gpu_memory_mib: int | None) -> int | None:
    """The core's ``PendingJob.gpu_milli`` of a spec: its own, or 0 for a job that asks only for GPU
    memory (fractional all the same: the core sizes its share per GPU, ``core.sharing.need_on``)."""
    return gpu_milli if gpu_milli is not None or gpu_memory_mib is None else 0


def attempt_end(start: float, time_limit_s: float | None) -> float | None:
    """The time-limit rule for a running gang: it holds its GPUs until its limit runs out at the latest,
    counted from the start of its current attempt, because that is when the job controller stops it
    (``control.reconcile``: each attempt gets the whole limit). None: no limit, no known end."""
    return None if time_limit_s is None else start + time_limit_s


def pending_time_limit(time_limit_s: float | None) -> float | None:
    """The time-limit rule for a waiting gang: its next attempt may run for the whole limit, however much
    of the work earlier attempts did (the reservation and backfill arithmetic read it)."""
    return None if time_limit_s is None else float(time_limit_s)


def cycle_needed(state: ClusterState) -> bool:
    """Whether the scheduler runs the core at all: a job waits, or an elastic gang could grow into idle
    GPUs (the core lends idle GPUs to elastic gangs when nobody waits, so an empty queue is no reason to
    skip). The simulator runs it on the same occasions (waiting jobs or elastic gangs running)."""
    return bool(state.pending_jobs()) or bool(state.growable_jobs())
