"""One replay per seed: arrivals in order, each placed by the policy or failed, never deleted."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rallypoint.sim.packing.baseline import BestFitPolicy, DotProductPolicy, RandomPolicy
from rallypoint.sim.packing.fgd import FGDPolicy, Fragmentation
from rallypoint.sim.packing.gpu import GpuClusteringPolicy, GpuPackingPolicy
from rallypoint.sim.packing.policy import Policy, pick
from rallypoint.sim.packing.protocol import TUNE_RATIO, arrivals, tie_order, typical_pods
from rallypoint.sim.packing.rally import RallypointPolicy
from rallypoint.sim.packing.state import Cluster, State
from rallypoint.sim.packing.trace import NodeSpec, PodSpec

POLICIES: dict[str, Callable[[Cluster, Sequence[PodSpec]], Policy]] = {
    "random": lambda c, p: RandomPolicy(),
    "dotprod": lambda c, p: DotProductPolicy(),
    "gpuclustering": lambda c, p: GpuClusteringPolicy(),
    "gpupacking": lambda c, p: GpuPackingPolicy(),
    "bestfit": lambda c, p: BestFitPolicy(),
    "fgd": lambda c, p: FGDPolicy(Fragmentation(c, typical_pods(p))),
    "rallypoint": lambda c, p: RallypointPolicy(c, p),
}
ALIASES = {"dot-product": "dotprod", "dotproduct": "dotprod", "gpu-clustering": "gpuclustering",
           "gpu-packing": "gpupacking", "best-fit": "bestfit"}  # fmt: skip


def resolve(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in POLICIES:
        raise ValueError(f"unknown packing policy {name!r}: one of {', '.join(POLICIES)}")
    return key


@dataclass(frozen=True, slots=True)
class SeedRun:
    seed: int
    pods: int
    failed_pods: int
    alloc_at_100: float  # percent of GPU capacity allocated when arrived demand first reached 100%
    alloc_final: float
    arrived_final: float  # percent of capacity offered in all
    decision_ms: list[float]


def run_seed(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], policy_name: str, seed: int,
             ratio: float = TUNE_RATIO) -> SeedRun:  # fmt: skip
    cluster = Cluster(nodes)
    if cluster.gpu_capacity == 0:
        raise ValueError("the cluster has no GPUs")
    policy = POLICIES[resolve(policy_name)](cluster, pods)
    rng = np.random.default_rng(seed)
    order = arrivals(pods, cluster.gpu_capacity, rng, ratio)
    rank = tie_order(cluster, rng)
    shaped = {i: cluster.pod(pods[i]) for i in set(order)}
    state = State(cluster)
    arrived = failed = 0
    at_100: float | None = None
    times: list[float] = []
    for i in order:
        pod = shaped[i]
        arrived += pod.total_milli
        t0 = time.perf_counter()
        nodes_ok = state.feasible(pod)
        if len(nodes_ok):
            node = pick(nodes_ok, policy.scores(state, pod, nodes_ok, rng), rank)
            state.place(node, pod, policy.gpus(state, pod, node, rng))
        else:
            failed += 1
        times.append((time.perf_counter() - t0) * 1000)
        if at_100 is None and arrived >= cluster.gpu_capacity:
            at_100 = 100.0 * state.allocated_milli / cluster.gpu_capacity
    final = 100.0 * state.allocated_milli / cluster.gpu_capacity
    return SeedRun(
        seed=seed,
        pods=len(order),
        failed_pods=failed,
        alloc_at_100=final if at_100 is None else at_100,
        alloc_final=final,
        arrived_final=100.0 * arrived / cluster.gpu_capacity,
        decision_ms=times,
    )
