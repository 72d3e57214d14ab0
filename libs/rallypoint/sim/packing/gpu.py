"""GPU-aware baselines: GPU Clustering and GPU Packing, as the FGD artifact ports them. GPU: best fit.

- GpuClustering: a GPU pod's kind is "shared" or "k whole GPUs". Base ``25 x (8000 - gpu_left) // 8000``
  (the fuller node scores higher), plus 75 when the node hosts only pods of this kind, 50 when it hosts this
  kind among others, 25 when it hosts no GPU pod, 0 when only other kinds. A CPU pod scores 0 everywhere.
- GpuPacking: a node with every GPU free scores ``max(33 - free, free)``; else, taking the GPUs the pod would
  use (the least-left GPUs that fit), ``max(50 - fully-free GPUs used, 33)`` when it must open free GPUs,
  else ``max(100 - (left x 100 // 1000) // 10, 50)`` summed over the shared GPUs it lands on: an already
  shared, fuller GPU first, then a used node, then an empty node. A CPU pod scores 0 everywhere.
"""

from __future__ import annotations

import numpy as np

from rallypoint.sim.packing.policy import BestFitGpus
from rallypoint.sim.packing.state import MILLI, Pod, State

MAX_GPU = 8_000


class GpuClusteringPolicy(BestFitGpus):
    name = "gpuclustering"

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if pod.tag < 0:
            return np.zeros(len(nodes), dtype=np.int64)
        aff = state.affinity[nodes]
        base = 25 * (MAX_GPU - state.gpu_left[nodes].sum(axis=1)) // MAX_GPU
        same = aff[:, pod.tag] > 0
        kinds = (aff > 0).sum(axis=1)
        bonus = np.where(same, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        return (base + bonus).astype(np.int64)


class GpuPackingPolicy(BestFitGpus):
    name = "gpupacking"

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        left = state.gpu_left[nodes]
        free = (left == MILLI).sum(axis=1)
        idle = free == state.cluster.gpus[nodes]
        out = np.maximum(33 - free, free)
        if pod.shared:
            fits = np.where(left >= pod.milli, left, MILLI + 1).min(axis=1)  # the best-fit GPU's left
            opens = fits == MILLI
            shared = np.maximum(100 - (fits * 100 // MILLI) // 10, 50)
            used = np.where(opens, 49, shared)  # max(50 - 1, 33) = 49
        else:
            used = np.full(len(nodes), max(50 - pod.num_gpu, 33))
        return np.where(idle, out, used).astype(np.int64)
