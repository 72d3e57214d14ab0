"""The cluster as numpy arrays, node by node and GPU by GPU, as the packing policies read it.

GPUs are padded to 8 per node; an absent GPU has 0 milli left, so it can never host anything. Allocation is in
thousandths of a GPU ("milli"). ``affinity[n, t]`` counts the GPU pods on node n by kind: t = 0 for shared
pods, t = k for pods of k whole GPUs (GPU Clustering reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rallypoint.sim.packing.trace import MILLI, NodeSpec, PodSpec

MAX_GPUS = 8


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the simulator places it: its request plus the GPU models it accepts (by model id)."""

    cpu: int
    memory: int
    num_gpu: int
    milli: int
    allowed: np.ndarray  # bool per model id

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.milli

    @property
    def tag(self) -> int:
        """GPU Clustering's affinity tag: 0 shared, k for k whole GPUs, -1 for a CPU pod."""
        if self.num_gpu == 0:
            return -1
        return 0 if self.shared else self.num_gpu


class Cluster:
    """Static facts of the nodes: capacities, GPU counts and model ids."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.names = [n.name for n in nodes]
        self.models: list[str] = sorted({n.model for n in nodes if n.gpus and n.model})
        ids = {m: i for i, m in enumerate(self.models)}
        self.model = np.array([ids.get(n.model, -1) if n.gpus else -1 for n in nodes], dtype=np.int64)
        self.gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.cpu = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.memory = np.array([n.memory for n in nodes], dtype=np.int64)
        self.gpu_capacity = int(self.gpus.sum()) * MILLI
        self.rank = np.argsort(np.argsort(np.array(self.names), kind="stable"), kind="stable")

    def __len__(self) -> int:
        return len(self.names)

    def allowed(self, spec: str) -> np.ndarray:
        """Per model id: may a pod of this ``gpu_spec`` use it (empty spec: any)."""
        wanted = {m for m in spec.split("|") if m}
        if not wanted:
            return np.ones(len(self.models), dtype=bool)
        return np.array([m in wanted for m in self.models], dtype=bool)

    def pod(self, spec: PodSpec) -> Pod:
        return Pod(spec.cpu, spec.memory, spec.num_gpu, spec.gpu_milli, self.allowed(spec.gpu_spec))


class State:
    """What is left on every node; ``place`` is the only mutation."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        n = len(cluster)
        self.cpu_left = cluster.cpu.copy()
        self.mem_left = cluster.memory.copy()
        present = np.arange(MAX_GPUS)[None, :] < cluster.gpus[:, None]
        self.gpu_left = np.where(present, MILLI, 0).astype(np.int64)
        self.affinity = np.zeros((n, MAX_GPUS + 1), dtype=np.int64)
        self.allocated_milli = 0
        self.version = np.zeros(n, dtype=np.int64)  # bumped on every placement (for caches of node facts)

    def accessible(self, pod: Pod) -> np.ndarray:
        """Nodes whose GPU model the pod accepts (every node for a CPU pod)."""
        if pod.num_gpu == 0:
            return np.ones(len(self.cluster), dtype=bool)
        model = self.cluster.model
        ok = np.zeros(len(model), dtype=bool)
        has = model >= 0
        ok[has] = pod.allowed[model[has]]
        return ok

    def feasible(self, pod: Pod) -> np.ndarray:
        """Indices of the nodes that can take the pod now: model, CPU, memory and GPUs."""
        ok = (self.cpu_left >= pod.cpu) & (self.mem_left >= pod.memory)
        if pod.num_gpu:
            ok &= self.accessible(pod)
            if pod.shared:
                ok &= (self.gpu_left >= pod.milli).any(axis=1)
            else:
                ok &= (self.gpu_left == MILLI).sum(axis=1) >= pod.num_gpu
        return np.flatnonzero(ok)

    def place(self, node: int, pod: Pod, gpus: Sequence[int]) -> None:
        if len(gpus) != pod.num_gpu:
            raise ValueError(f"pod needs {pod.num_gpu} GPUs, given {list(gpus)}")
        self.cpu_left[node] -= pod.cpu
        self.mem_left[node] -= pod.memory
        for g in gpus:
            if self.gpu_left[node, g] < pod.milli:
                raise ValueError(f"GPU {g} of node {node} has {self.gpu_left[node, g]} milli left")
            self.gpu_left[node, g] -= pod.milli
        if self.cpu_left[node] < 0 or self.mem_left[node] < 0:
            raise ValueError(f"node {node} over-committed")
        if pod.tag >= 0:
            self.affinity[node, pod.tag] += 1
        self.version[node] += 1
        self.allocated_milli += pod.total_milli


def exclusive_gpus(left: np.ndarray, num: int) -> list[int]:
    """The lowest-indexed fully free GPUs of one node (how every policy gives whole GPUs)."""
    return [int(i) for i in np.flatnonzero(left == MILLI)[:num]]


def best_fit_gpu(left: np.ndarray, milli: int) -> int:
    """A shared pod's GPU: the one with the least left that still fits, the lowest index on a tie."""
    fits = np.where(left >= milli, left, MILLI + 1)
    return int(np.argmin(fits))
