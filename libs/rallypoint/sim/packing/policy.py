"""The policy interface: integer node scores (higher is better) and the GPUs a pod gets on the chosen node.

As in the Kubernetes scheduler the original runs in, the node with the highest score wins; a tie goes to the
node whose name sorts first (the artifact's vendored ``selectHost`` does this "for reproducibility" instead of
upstream's uniform draw, and it matters: a CPU pod that every node scores alike lands on the first node, not
anywhere). The artifact's simulator prefixes every node name with a per-seed random number, so "first" is a
random order fixed for the run: ``protocol.tie_order`` draws it, ``Cluster.rank`` is plain name order.
A shared pod's GPU is chosen by the policy's own rule (``best_fit_gpu`` unless it has one), whole GPUs are
always the lowest-indexed free ones.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from rallypoint.sim.packing.state import Pod, State, best_fit_gpu, exclusive_gpus


class Policy(Protocol):
    name: str

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One integer score per node of ``nodes`` (all feasible)."""
        ...

    def gpus(self, state: State, pod: Pod, node: int, rng: np.random.Generator) -> list[int]: ...


class BestFitGpus:
    """GPU choice shared by the baselines run with ``gpuSelMethod: best``."""

    def gpus(self, state: State, pod: Pod, node: int, rng: np.random.Generator) -> list[int]:
        if pod.num_gpu == 0:
            return []
        left = state.gpu_left[node]
        if pod.shared:
            return [best_fit_gpu(left, pod.milli)]
        return exclusive_gpus(left, pod.num_gpu)


def pick(nodes: np.ndarray, scores: np.ndarray, rank: np.ndarray) -> int:
    """The highest-scored node; on a tie the one of lowest ``rank`` (``protocol.tie_order``)."""
    best = nodes[scores == scores.max()]
    return int(best[0] if len(best) == 1 else best[np.argmin(rank[best])])
