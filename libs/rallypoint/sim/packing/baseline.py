"""Resource-vector baselines: Random, Dot-product (Tetris) and Best-fit, as the FGD artifact configures them.

- Random: every feasible node scores 0 except one drawn uniformly, which scores 100; a shared pod takes a
  GPU drawn uniformly among those it fits on.
- DotProd (dimension ``merge``, norm ``max``): node vector (cpu left, GPU milli left in total), pod vector
  (cpu, num_gpu x gpu_milli), both divided by the largest node (128 cores, 8 GPUs); score
  ``int(100 x (1 - dot / 2))``: the node whose free resources align least with the pod wins. GPU: best fit.
- BestFit: ``int(100 x (1 - (0.5 (cpu_left - cpu) / 128000 + 0.5 (gpu_left - gpu) / 8000)))``: the node left
  with the least free resource wins. (The original min-max normalises these integer scores to 0..100; that
  map is monotone and one-to-one on a span of at most 100, so the winner is the same.) GPU: best fit.
"""

from __future__ import annotations

import numpy as np

from rallypoint.sim.packing.policy import BestFitGpus
from rallypoint.sim.packing.state import Pod, State, exclusive_gpus

MAX_CPU = 128_000  # milli: the largest node the original normalises by
MAX_GPU = 8_000


class RandomPolicy:
    name = "random"

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(len(nodes), dtype=np.int64)
        out[int(rng.integers(len(nodes)))] = 100
        return out

    def gpus(self, state: State, pod: Pod, node: int, rng: np.random.Generator) -> list[int]:
        left = state.gpu_left[node]
        if pod.shared:
            fits = np.flatnonzero(left >= pod.milli)
            return [int(fits[int(rng.integers(len(fits)))])]
        return exclusive_gpus(left, pod.num_gpu)


class DotProductPolicy(BestFitGpus):
    name = "dotprod"

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cpu = state.cpu_left[nodes] / MAX_CPU
        gpu = state.gpu_left[nodes].sum(axis=1) / MAX_GPU
        dot = (cpu * (pod.cpu / MAX_CPU) + gpu * (pod.total_milli / MAX_GPU)) / 2
        return ((1.0 - dot) * 100).astype(np.int64)


class BestFitPolicy(BestFitGpus):
    name = "bestfit"

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cpu = (state.cpu_left[nodes] - pod.cpu) / MAX_CPU
        gpu = (state.gpu_left[nodes].sum(axis=1) - pod.total_milli) / MAX_GPU
        return ((1.0 - (0.5 * cpu + 0.5 * gpu)) * 100).astype(np.int64)
