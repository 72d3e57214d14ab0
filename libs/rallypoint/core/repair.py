"""In-place repair of a gang that lost nodes: replacement nodes for its missing tasks. Pure.

The healthy part of the gang keeps its GPUs; only the failed nodes' tasks need a home. Each missing task
goes to the free node closest to the survivors (same rack, else same spine, else anywhere), of the
gang's GPU type, inside one NVLink domain when the task fits one; among equally close nodes the one with
the fewest free GPUs wins (best fit keeps whole nodes free for gangs), then the node id. Deterministic:
the same cluster gives the same replacements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rallypoint.core.cluster import ClusterModel
from rallypoint.core.types import Node, TaskPlacement

__all__ = ["place_replacements", "renumbered"]


def _task_gpus(node: Node, free: set[int], gpus: int) -> tuple[int, ...] | None:
    """GPUs for one task on ``node`` from ``free``: the tightest NVLink domain that holds it, else the
    lowest free indices when the task is wider than a domain."""
    fitting = [d for d in node.nvlink_domains if len(d) >= gpus]
    if fitting:
        best: tuple[int, ...] | None = None
        for domain in fitting:
            room = [g for g in domain if g in free]
            if len(room) >= gpus and (best is None or len(room) < len(best)):
                best = tuple(room)
        return best[:gpus] if best is not None else None
    if len(free) < gpus:
        return None
    return tuple(sorted(free)[:gpus])


def place_replacements(
    cluster: ClusterModel,
    survivors: Sequence[TaskPlacement],
    missing_tasks: Sequence[int],
    gpus_per_task: int,
    gpu_type: str,
    excluded: Sequence[str] = (),
    taken: Mapping[str, set[int]] | None = None,
    admits: Callable[[Node], bool] | None = None,
) -> tuple[TaskPlacement, ...] | None:
    """A placement for every task in ``missing_tasks``, or None when they do not all fit now.

    ``excluded`` nodes (the failed ones) are never chosen, whatever their state says; ``taken`` GPUs are
    free in ``cluster`` but already promised (to an earlier repair of the same cycle). ``admits``: whether
    the job's placement rules allow a node (``constraints.node_admits``); by default an untainted one.
    """
    allows = admits if admits is not None else _untainted
    promised = taken or {}
    nodes = cluster.nodes
    racks = {nodes[p.node_id].rack for p in survivors if p.node_id in nodes}
    spines = {nodes[p.node_id].spine for p in survivors if p.node_id in nodes}
    banned = set(excluded)
    free = {
        nid: set(cluster.free_gpus(nid)) - promised.get(nid, set())
        for nid, node in nodes.items()
        if node.schedulable and node.gpu_type == gpu_type and nid not in banned and allows(node)
    }
    out: list[TaskPlacement] = []
    for task in sorted(missing_tasks):
        choice = _closest(nodes, free, racks, spines, gpus_per_task)
        if choice is None:
            return None
        node_id, gpus = choice
        free[node_id] -= set(gpus)
        out.append(TaskPlacement(task=task, node_id=node_id, gpus=gpus))
    return tuple(out)


def _untainted(node: Node) -> bool:
    return not node.taints


def _closest(
    nodes: dict[str, Node], free: dict[str, set[int]], racks: set[str], spines: set[str], gpus: int
) -> tuple[str, tuple[int, ...]] | None:
    best: tuple[tuple[int, int, str], tuple[int, ...]] | None = None
    for node_id, room in free.items():
        if len(room) < gpus:
            continue
        node = nodes[node_id]
        distance = 0 if node.rack in racks else 1 if node.spine in spines else 2
        key = (distance, len(room), node_id)
        if best is not None and key >= best[0]:
            continue
        picked = _task_gpus(node, room, gpus)
        if picked is not None:
            best = (key, picked)
    return None if best is None else (best[0][2], best[1])


def renumbered(placements: Sequence[TaskPlacement]) -> tuple[TaskPlacement, ...]:
    """Tasks numbered 0..k-1 in their old order: a gang that shrank to its survivors ranks densely."""
    ordered = sorted(placements, key=lambda p: p.task)
    return tuple(TaskPlacement(task=i, node_id=p.node_id, gpus=p.gpus) for i, p in enumerate(ordered))
