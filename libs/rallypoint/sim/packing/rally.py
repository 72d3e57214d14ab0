"""Rallypoint's packing policy: FGD's fragmentation gradient, made aware of memory, of stranded GPUs and of
what a shared GPU can still be filled to.

FGD (``fgd.py``) scores a node by how much its fragmentation grows, where a GPU's idle milli is fragment for
each typical pod shape that cannot use it. On openb that measure misses three things that decide the last
points of allocation:

- Pods whose GPUs exist but whose CPU or memory does not. A G2 node has 12 cores and 48 GiB per GPU, the
  trace's GPU pods ask for about 11 cores and 49 GiB per GPU, CPU pods take more, so nodes run dry of CPU or
  memory with GPUs still idle (under FGD at seed 42, 135 whole-GPU pods fail for CPU and 113 shared pods for
  memory before 100% has arrived).
- What a partly used GPU can still become. FGD counts a GPU with 350 milli left as usable by every shape up
  to 350, whether a 320 (30 left over) or a 230 (120 left over) will fill it.
- Shapes that only a few GPU models accept. A pod asking for P100s can use 265 of the 6,212 GPUs, yet FGD
  weighs its shape by its share of the pods alone, so taking a P100 for a pod that could go anywhere costs
  the score less than one integer step, and the tie goes to whichever node comes first.

The measure this policy descends is, per node:

    fragmentation (FGD's, its shapes also needing their median memory, and each shape's share scaled by
                   all GPUs / the GPUs of the models it accepts, renormalised to the same total)
    + stranded GPU milli = max(0, idle GPU milli - min(cpu left / c, memory left / m))
    + WASTE x sum over GPUs of waste(milli left)

with c and m the trace's CPU and memory per GPU milli over its GPU pods (the idle GPU milli that the node's
CPU or memory could not feed at the workload's own mix), and waste(r) what is left of r when it is filled
as fully as the common GPU sizes allow (any number of each: r minus the largest sum of them that fits). A
size is common when at least 1% of the target pods ask for it (``filler_sizes``): on openb default 1,078
pods of 0.81 GPU each leave 190 milli, and the 0.16-GPU pods (0.9% of pods) that could fill it are too few
to fill even one hole in ten, so counting a 190 hole as "30 once a 0.16 comes" made the policy open
such holes too lightly. Everything else is FGD's: the score ``int(100 sigmoid(-delta / 1000))`` (near-equal
deltas tie, and ties go to one fixed node order, which fills nodes one after another and leaves the rest
whole), whole GPUs the lowest-indexed free ones, a shared pod's GPU the best-scored one. Nothing is keyed on
the trace: c, m, the shapes, their weights and their sizes come from the pods and nodes given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from rallypoint.sim.packing.fgd import FGDPolicy, Fragmentation
from rallypoint.sim.packing.protocol import Shape, demand_shapes
from rallypoint.sim.packing.state import Cluster
from rallypoint.sim.packing.trace import MILLI, PodSpec

WASTE = 2.0  # weight of the left-over term (1 to 3 gave the same on openb default; 10 worse, 0 worse)
# A GPU size counts as a filler of left-overs only if at least this share of the target pods ask for it:
# a rarer size will not come often enough to fill the holes it could (see ``filler_sizes``).
FILLER_SHARE = 0.01


def waste_table(sizes: Sequence[int]) -> np.ndarray:
    """waste[r] for r = 0..1000: r minus the largest sum of ``sizes`` (each any number of times) within r."""
    reach = np.zeros(MILLI + 1, dtype=bool)
    reach[0] = True
    steps = sorted({int(z) for z in sizes if 0 < z <= MILLI})
    for r in range(1, MILLI + 1):
        reach[r] = any(reach[r - z] for z in steps if z <= r)
    milli = np.arange(MILLI + 1)
    return (milli - np.maximum.accumulate(np.where(reach, milli, 0))).astype(np.float64)


def filler_sizes(shapes: Sequence[Shape], least: float = FILLER_SHARE) -> list[int]:
    """The GPU sizes (milli per GPU) that at least ``least`` of the shapes' pods ask for, summed by size."""
    share: dict[int, float] = {}
    for s in shapes:
        if s.milli:
            share[s.milli] = share.get(s.milli, 0.0) + s.share
    total = sum(s.share for s in shapes)
    return sorted(z for z, w in share.items() if w >= least * total)


def scarcity_weighted(cluster: Cluster, shapes: Sequence[Shape]) -> list[Shape]:
    """Each shape's share times (all GPUs / GPUs of the models it accepts), renormalised to the same total."""
    has = cluster.model >= 0
    capacity = np.bincount(cluster.model[has], weights=cluster.gpus[has], minlength=len(cluster.models))
    total = capacity.sum()
    raw = []
    for s in shapes:
        reach = capacity[cluster.allowed(s.gpu_spec)].sum() if s.milli else total
        raw.append(s.share * (total / reach if reach else 1.0))
    scale = sum(s.share for s in shapes) / sum(raw) if sum(raw) else 1.0
    return [replace(s, share=w * scale) for s, w in zip(shapes, raw, strict=True)]


class RallypointPolicy(FGDPolicy):
    name = "rallypoint"

    def __init__(self, cluster: Cluster, pods: Sequence[PodSpec]) -> None:
        shapes = demand_shapes(pods)
        super().__init__(Fragmentation(cluster, scarcity_weighted(cluster, shapes)))
        gpu_pods = [p for p in pods if p.num_gpu]
        milli = sum(p.total_milli for p in gpu_pods)
        # milli GPU that one milli CPU / one MiB feeds at the workload's mix (inf: nothing to feed)
        self.per_cpu = milli / max(sum(p.cpu for p in gpu_pods), 1) if milli else np.inf
        self.per_mib = milli / max(sum(p.memory for p in gpu_pods), 1) if milli else np.inf
        self.waste = WASTE * waste_table(filler_sizes(shapes))

    def measure(
        self, cpu_left: np.ndarray, mem_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray
    ) -> np.ndarray:
        fed = np.minimum(cpu_left * self.per_cpu, mem_left * self.per_mib)
        stranded = np.maximum(gpu_left.sum(axis=1) - fed, 0.0)
        left_over = self.waste[gpu_left].sum(axis=1)
        return self.frag.of(cpu_left, gpu_left, model, mem_left) + stranded + left_over
