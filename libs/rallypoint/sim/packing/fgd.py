"""Fragmentation Gradient Descent (FGD, ATC'23) and the fragmentation measure it descends.

A node's fragmentation against the target workload (``typical_pods``) is, summed over the typical pod
shapes k with share p_k: p_k x (GPU milli left on the node) when the node cannot run shape k, and p_k x
(milli left on GPUs too small for k) when it can. "Can run" needs the shape's GPU model accepted here, enough
GPUs each with at least k's ``gpu_milli`` left, and k's CPU left; a CPU shape (no GPU) never counts as
runnable, so its share of the idle GPUs is always fragment. Memory is not part of the measure.

FGD places a pod where fragmentation grows least: a node scores ``int(100 x sigmoid((F_before - F_after) /
1000))`` (whole GPUs: the lowest-indexed free ones; a shared pod: the GPU with the best score, the lowest
index on a tie, which is also the GPU it gets). Integer scores tie often; ties go to the node name that
sorts first (``policy.pick``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rallypoint.sim.packing.protocol import Shape
from rallypoint.sim.packing.state import MILLI, Cluster, Pod, State, exclusive_gpus


class Fragmentation:
    """Vectorised fragmentation of many node states at once."""

    def __init__(self, cluster: Cluster, shapes: Sequence[Shape]) -> None:
        gpu_shapes = [s for s in shapes if s.milli > 0]
        self.always = sum(s.share for s in shapes if s.milli == 0)  # CPU shapes: all idle GPU is fragment
        self.total_share = sum(s.share for s in shapes)
        self.share = np.array([s.share for s in gpu_shapes], dtype=np.float64)
        self.cpu = np.array([s.cpu for s in gpu_shapes], dtype=np.int64)
        self.memory = np.array([s.memory for s in gpu_shapes], dtype=np.int64)
        self.needs_memory = bool(self.memory.any())  # FGD's own shapes: no
        self.num = np.array([s.num_gpu for s in gpu_shapes], dtype=np.int64)
        self.levels, self.level = np.unique(
            np.array([s.milli for s in gpu_shapes], dtype=np.int64), return_inverse=True
        )
        self.level = self.level.reshape(-1)
        # access[model + 1, k]: may shape k run on this model (row 0: nodes without GPUs)
        access = np.zeros((len(cluster.models) + 1, len(gpu_shapes)), dtype=bool)
        for k, s in enumerate(gpu_shapes):
            access[1:, k] = cluster.allowed(s.gpu_spec)
        self.access = access

    def of(
        self,
        cpu_left: np.ndarray,
        gpu_left: np.ndarray,
        model: np.ndarray,
        mem_left: np.ndarray | None = None,
    ) -> np.ndarray:
        """Fragmentation (milli GPU) of M node states: cpu_left (M,), gpu_left (M, 8), model id (M,).

        ``mem_left`` (M,) is looked at only where the shapes have a memory (``Shape.memory``).
        """
        idle = gpu_left.sum(axis=1).astype(np.float64)
        if not len(self.share):
            return idle * self.total_share
        m, n = gpu_left.shape[0], len(self.levels) + 1
        # a GPU's bucket: how many of the distinct shape levels fit in what it has left (0..L)
        cell = (np.searchsorted(self.levels, gpu_left, side="right") + n * np.arange(m)[:, None]).ravel()
        gpus = np.bincount(cell, minlength=m * n).reshape(m, n)
        milli = np.bincount(cell, weights=gpu_left.ravel(), minlength=m * n).reshape(m, n).astype(np.int64)
        # per level l: the GPUs in buckets above l (reversed cumulative sums), then per shape k its level's
        count = np.cumsum(gpus[:, :0:-1], axis=1)[:, ::-1][:, self.level]  # GPUs that can take shape k
        usable = np.cumsum(milli[:, :0:-1], axis=1)[:, ::-1][:, self.level]  # milli on those GPUs
        runs = (count >= self.num) & (cpu_left[:, None] >= self.cpu) & self.access[model + 1]
        if self.needs_memory and mem_left is not None:
            runs &= mem_left[:, None] >= self.memory
        return idle * self.total_share - (runs * usable) @ self.share


def _score(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    return (100.0 / (1.0 + np.exp(-(before - after) / 1000.0))).astype(np.int64)


class FGDPolicy:
    name = "fgd"

    def __init__(self, frag: Fragmentation) -> None:
        self.frag = frag
        self._state: State | None = None
        self._cached = np.zeros(0)
        self._seen = np.zeros(0, dtype=np.int64)

    def measure(
        self, cpu_left: np.ndarray, mem_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray
    ) -> np.ndarray:
        """What the policy descends, per node state (FGD: the fragmentation)."""
        return self.frag.of(cpu_left, gpu_left, model, mem_left)

    def _measure_distinct(
        self, cpu_left: np.ndarray, mem_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray
    ) -> np.ndarray:
        """``measure`` of M node states, computed once per distinct state (the same values, faster).

        The measure reads a node's GPUs as a multiset, so states equal up to GPU order are one state; early
        in a replay most candidate nodes are still untouched and equal to many others of their model.
        """
        if len(model) < 64:
            return self.measure(cpu_left, mem_left, gpu_left, model)
        key = np.column_stack([model, cpu_left, mem_left, np.sort(gpu_left, axis=1)])
        order = np.lexsort(key.T[::-1])
        ranked = key[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
        rows = order[first]
        group = np.empty(len(order), dtype=np.int64)
        group[order] = np.cumsum(first) - 1
        return self.measure(cpu_left[rows], mem_left[rows], gpu_left[rows], model[rows])[group]

    def _frag_now(self, state: State, nodes: np.ndarray) -> np.ndarray:
        """Current fragmentation of ``nodes``, recomputed only for nodes placed on since last asked."""
        if self._state is not state:
            self._state = state
            self._cached = np.zeros(len(state.cluster))
            self._seen = np.full(len(state.cluster), -1, dtype=np.int64)
        stale = nodes[self._seen[nodes] != state.version[nodes]]
        if len(stale):
            self._cached[stale] = self._measure_distinct(
                state.cpu_left[stale],
                state.mem_left[stale],
                state.gpu_left[stale],
                state.cluster.model[stale],
            )
            self._seen[stale] = state.version[stale]
        return self._cached[nodes]

    def _shared(self, state: State, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the best score over the GPUs the pod fits on, and that GPU."""
        left = state.gpu_left[nodes]
        # GPUs with equal milli left on one node give the same state: try only the lowest-indexed of them
        earlier_same = np.tril(left[:, :, None] == left[:, None, :], k=-1).any(axis=2)
        rows, gpus = np.nonzero((left >= pod.milli) & ~earlier_same)
        after_gpu = left[rows].copy()
        after_gpu[np.arange(len(rows)), gpus] -= pod.milli
        node_ids = nodes[rows]
        after = self._measure_distinct(
            state.cpu_left[node_ids] - pod.cpu,
            state.mem_left[node_ids] - pod.memory,
            after_gpu,
            state.cluster.model[node_ids],
        )
        table = np.full(left.shape, -np.inf)
        table[rows, gpus] = _score(self._frag_now(state, nodes)[rows], after)
        return table.max(axis=1).astype(np.int64), table.argmax(axis=1)

    def scores(self, state: State, pod: Pod, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if pod.shared:
            return self._shared(state, pod, nodes)[0]
        before = self._frag_now(state, nodes)
        left = state.gpu_left[nodes].copy()
        if pod.num_gpu:
            free = left == MILLI
            take = free & (np.cumsum(free, axis=1) <= pod.num_gpu)  # the lowest-indexed free GPUs
            left[take] = 0
        after = self._measure_distinct(
            state.cpu_left[nodes] - pod.cpu,
            state.mem_left[nodes] - pod.memory,
            left,
            state.cluster.model[nodes],
        )
        return _score(before, after)

    def gpus(self, state: State, pod: Pod, node: int, rng: np.random.Generator) -> list[int]:
        if pod.shared:
            return [int(self._shared(state, pod, np.array([node]))[1][0])]
        return exclusive_gpus(state.gpu_left[node], pod.num_gpu)
