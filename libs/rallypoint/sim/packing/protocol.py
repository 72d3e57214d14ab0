"""FGD's evaluation protocol (ATC'23 "Beware of Fragmentation", and its simulator's workload tuning).

``arrivals``: the trace's pods, plus pods drawn at random (with replacement) from the trace until one more
draw would push the summed GPU request past ``ratio`` x the cluster's GPU capacity (the draw is tested on its
per-GPU ``gpu_milli``, as the original does), then the whole list shuffled. Pods arrive one by one and
never leave. ``arrived demand`` is the summed GPU request (num_gpu x gpu_milli) of the pods offered so far,
placed or not; the allocation is read when it first reaches 100% of capacity.

``tie_order``: the order in which tied nodes are picked. The original's scheduler takes the tied node whose
name sorts first, and its simulator, before creating the nodes, prefixes each name (in name order) with
``%04d-`` of a random permutation drawn from the seeded stream after the workload: so ties go by a random
order, fixed for the whole run and different per seed, not by the trace's node names.

``typical_pods``: the target workload FGD measures fragmentation against: pod shapes (cpu, gpu_milli, num_gpu,
gpu_spec) of the trace, CPU pods included, by popularity, the most popular first until they cover 95% of the
pods, their shares renormalised to sum to 1.

``demand_shapes``: the same shapes, each with the median memory of its pods (the rallypoint policy's target
workload, which also asks whether a node has the memory a shape needs; FGD's shapes have ``memory == 0``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rallypoint.sim.packing.state import Cluster
from rallypoint.sim.packing.trace import PodSpec

TUNE_RATIO = 1.3
POPULARITY = 0.95


def arrivals(
    pods: Sequence[PodSpec], gpu_capacity: int, rng: np.random.Generator, ratio: float = TUNE_RATIO
) -> list[int]:
    """Indices into ``pods`` in arrival order (a drawn pod repeats its index)."""
    order = list(range(len(pods)))
    total = sum(p.total_milli for p in pods)
    target = ratio * gpu_capacity
    if total > target:  # trim at random until under the target
        while total > target and order:
            k = int(rng.integers(len(order)))
            total -= pods[order.pop(k)].total_milli
    elif total < target:
        while True:
            k = int(rng.integers(len(pods)))
            if total + pods[k].gpu_milli > target:
                break
            total += pods[k].total_milli
            order.append(k)
    rng.shuffle(order)
    return order


def tie_order(cluster: Cluster, rng: np.random.Generator) -> np.ndarray:
    """Per node, its place among tied nodes (lowest first): a permutation drawn from ``rng`` given to the
    nodes in name order, as the original's random name prefixes (drawn after ``arrivals``, as there)."""
    return rng.permutation(len(cluster))[cluster.rank]


@dataclass(frozen=True, slots=True)
class Shape:
    cpu: int
    milli: int
    num_gpu: int
    gpu_spec: str
    share: float
    memory: int = 0  # MiB; 0 (FGD's shapes): memory is not looked at


Key = tuple[int, int, int, str]


def _key(p: PodSpec) -> Key:
    return (p.cpu, p.gpu_milli, p.num_gpu, p.gpu_spec)


def _popular(pods: Sequence[PodSpec], popularity: float) -> list[tuple[Key, int]]:
    """Shape keys and pod counts, the most popular first until they cover ``popularity`` of the pods."""
    counts = Counter(_key(p) for p in pods)
    # most popular first; equal counts: the larger shape first (cpu, then milli, num, spec)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = sum(counts.values())
    chosen: list[tuple[Key, int]] = []
    covered = 0
    for key, n in ranked:
        if covered >= popularity * total:
            break
        chosen.append((key, n))
        covered += n
    return chosen


def typical_pods(pods: Sequence[PodSpec], popularity: float = POPULARITY) -> list[Shape]:
    chosen = _popular(pods, popularity)
    covered = sum(n for _, n in chosen)
    return [Shape(cpu, milli, num, spec, n / covered) for (cpu, milli, num, spec), n in chosen]


def demand_shapes(pods: Sequence[PodSpec], popularity: float = POPULARITY) -> list[Shape]:
    """``typical_pods`` with each shape's median memory (MiB) over the trace's pods of that shape."""
    memory: dict[Key, list[int]] = defaultdict(list)
    for p in pods:
        memory[_key(p)].append(p.memory)
    chosen = _popular(pods, popularity)
    covered = sum(n for _, n in chosen)
    return [
        Shape(cpu, milli, num, spec, n / covered, int(np.median(memory[(cpu, milli, num, spec)])))
        for (cpu, milli, num, spec), n in chosen
    ]
