"""Rallypoint's packing policy: FGD's fragmentation gradient, made aware of memory and of stranded GPUs.

FGD (``fgd.py``) scores a node by how much its fragmentation grows, where a GPU's idle milli is fragment for
each typical pod shape that cannot use it. On openb that measure misses what fails most under FGD once the
cluster fills: pods whose GPUs exist but whose CPU or memory does not (a G2 node has 12 cores and 48 GiB per
GPU, the trace's GPU pods ask for about 11 cores and 49 GiB per GPU, CPU pods take more), so nodes run dry of
CPU or memory with GPUs still idle. The measure this policy descends is, per node:

    fragmentation (FGD's, its shapes also needing their median memory)
    + stranded GPU milli = max(0, idle GPU milli - min(cpu left / c, memory left / m))

with c and m the trace's CPU and memory per GPU milli over its GPU pods: the idle GPU milli that the node's
CPU or memory could not feed at the workload's own mix. Everything else is FGD's: the score
``int(100 sigmoid(-delta / 1000))`` (near-equal deltas tie, and ties go to the name that sorts first, which
fills nodes in one fixed order and leaves the rest whole), whole GPUs the lowest-indexed free ones, a shared
pod's GPU the best-scored one. Nothing is keyed on the trace: c, m and the shapes come from the pods given.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rallypoint.sim.packing.fgd import FGDPolicy, Fragmentation
from rallypoint.sim.packing.protocol import demand_shapes
from rallypoint.sim.packing.state import Cluster
from rallypoint.sim.packing.trace import PodSpec


class RallypointPolicy(FGDPolicy):
    name = "rallypoint"

    def __init__(self, cluster: Cluster, pods: Sequence[PodSpec]) -> None:
        super().__init__(Fragmentation(cluster, demand_shapes(pods)))
        gpu_pods = [p for p in pods if p.num_gpu]
        milli = sum(p.total_milli for p in gpu_pods)
        # milli GPU that one milli CPU / one MiB feeds at the workload's mix (inf: nothing to feed)
        self.per_cpu = milli / max(sum(p.cpu for p in gpu_pods), 1) if milli else np.inf
        self.per_mib = milli / max(sum(p.memory for p in gpu_pods), 1) if milli else np.inf

    def measure(
        self, cpu_left: np.ndarray, mem_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray
    ) -> np.ndarray:
        fed = np.minimum(cpu_left * self.per_cpu, mem_left * self.per_mib)
        stranded = np.maximum(gpu_left.sum(axis=1) - fed, 0.0)
        return self.frag.of(cpu_left, gpu_left, model, mem_left) + stranded
