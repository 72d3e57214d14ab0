"""openb replayed with departures: pods arrive at their recorded time, wait in a queue when they do not fit,
and leave when their recorded lifetime is over (docs/packing-replay.md).

- **Arrival**: ``creation_time`` (minus the first one, divided by ``speedup``: 1 replays the trace as
  recorded, k > 1 packs the arrivals k times closer and leaves every lifetime as it is).
- **Departure**: ``lifetime`` seconds after the pod *started* (``deletion_time - creation_time``): a pod
  that started at once leaves at its ``deletion_time``; one that waited leaves as much later.
- **Queue**: kube-scheduler's discipline, FIFO without head-of-line blocking. A pod that does not fit joins
  the back of the queue; whenever pods leave, the queue is walked from its head and every pod that now fits
  starts (a pod the head cannot use goes to one behind it). Each attempt is a full decision by the policy:
  filter, score, pick, GPUs. A pod that does not fit even the empty cluster fails at once and never queues.
- **Same instant**: departures first, then the queue, then the arrivals in file order.

The policies are those of the FGD protocol (``runner.POLICIES``), run unchanged on the shared ``State``;
``release`` gives a pod's resources back (``State`` itself only places).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rallypoint.sim.packing.policy import Policy, pick
from rallypoint.sim.packing.protocol import TUNE_RATIO, arrivals, tie_order
from rallypoint.sim.packing.runner import POLICIES, resolve
from rallypoint.sim.packing.state import Cluster, Pod, State
from rallypoint.sim.packing.timed import TimedPod
from rallypoint.sim.packing.trace import MILLI, NodeSpec, PodSpec

Placement = tuple[int, list[int]]  # node, GPUs


def release(state: State, node: int, pod: Pod, gpus: Sequence[int]) -> None:
    """Undo ``state.place(node, pod, gpus)``: the pod's CPU, memory and GPU milli back on its node."""
    cluster = state.cluster
    state.cpu_left[node] += pod.cpu
    state.mem_left[node] += pod.memory
    for g in gpus:
        state.gpu_left[node, g] += pod.milli
        if state.gpu_left[node, g] > MILLI:
            raise ValueError(f"GPU {g} of node {node} released past its capacity")
    if state.cpu_left[node] > cluster.cpu[node] or state.mem_left[node] > cluster.memory[node]:
        raise ValueError(f"node {node} released past its capacity")
    if pod.tag >= 0:
        state.affinity[node, pod.tag] -= 1
    state.version[node] += 1  # node facts cached by a policy (FGD's fragmentation) are stale now
    state.allocated_milli -= pod.total_milli


class Placer:
    """One policy deciding pods on one state; every decision timed (filter, score, pick, GPUs)."""

    def __init__(
        self, cluster: Cluster, policy: Policy, rng: np.random.Generator, rank: np.ndarray | None = None
    ) -> None:
        self.state = State(cluster)
        self.rank = cluster.rank if rank is None else rank  # tie order (see ``pick``)
        self.policy = policy
        self.rng = rng
        self.decision_ms: list[float] = []

    def place(self, pod: Pod) -> Placement | None:
        t0 = time.perf_counter()
        state = self.state
        nodes = state.feasible(pod)
        where: Placement | None = None
        if len(nodes):
            node = pick(nodes, self.policy.scores(state, pod, nodes, self.rng), self.rank)
            where = node, self.policy.gpus(state, pod, node, self.rng)
            state.place(node, pod, where[1])
        self.decision_ms.append((time.perf_counter() - t0) * 1000)
        return where


def _key(spec: PodSpec) -> tuple[int, int, int, int, str]:
    """What decides whether a pod fits: pods with equal keys fit on exactly the same nodes."""
    return spec.cpu, spec.memory, spec.num_gpu, spec.gpu_milli, spec.gpu_spec


@dataclass(frozen=True, slots=True)
class ReplayRun:
    policy: str
    seed: int
    speedup: float
    pods: int
    placed: int
    failed: int  # pods that do not fit even the empty cluster
    waits: list[float | None]  # per pod in file order: seconds from arrival to start (None: failed)
    time_avg_alloc: float  # percent of GPU capacity, averaged over [first arrival, last departure]
    horizon_s: float
    peak_alloc: float  # percent of GPU capacity: the most allocated at once
    alloc_while_waiting: float | None  # the same average over the time some pod waited (None: none did)
    backlog_s: float
    max_queue: int
    decision_ms: list[float]


def run_replay(
    nodes: Sequence[NodeSpec],
    pods: Sequence[TimedPod],
    policy_name: str,
    seed: int = 42,
    speedup: float = 1.0,
) -> ReplayRun:
    if not pods:
        raise ValueError("no pods to replay")
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0, not {speedup}")
    cluster = Cluster(nodes)
    if cluster.gpu_capacity == 0:
        raise ValueError("the cluster has no GPUs")
    name = resolve(policy_name)
    specs = [p.spec for p in pods]
    placer = Placer(cluster, POLICIES[name](cluster, specs), np.random.default_rng(seed))
    state = placer.state
    shaped: dict[tuple[int, int, int, int, str], Pod] = {}
    for spec in specs:
        shaped.setdefault(_key(spec), cluster.pod(spec))
    empty = State(cluster)
    never = {k for k, pod in shaped.items() if not len(empty.feasible(pod))}

    t0 = min(p.created for p in pods)
    at = [(p.created - t0) / speedup for p in pods]
    order = sorted(range(len(pods)), key=lambda i: at[i])  # stable: file order within an instant
    departures: list[tuple[float, int, int, list[int]]] = []  # (time, pod, node, GPUs)
    queue: list[int] = []
    waits: list[float | None] = [None] * len(pods)
    failed = max_queue = 0
    area = 0.0  # allocated milli x seconds
    backlog_area = backlog_s = 0.0  # the same, and the seconds, while some pod waits
    peak = 0  # the most milli allocated over a stretch of time
    now = at[order[0]]

    def start(i: int) -> bool:
        where = placer.place(shaped[_key(specs[i])])
        if where is None:
            return False
        waits[i] = now - at[i]
        heapq.heappush(departures, (now + pods[i].lifetime, i, *where))
        return True

    k = 0
    while k < len(order) or departures:
        t = min(at[order[k]] if k < len(order) else np.inf, departures[0][0] if departures else np.inf)
        area += state.allocated_milli * (t - now)
        if t > now:
            peak = max(peak, state.allocated_milli)
        if queue:
            backlog_area += state.allocated_milli * (t - now)
            backlog_s += t - now
        now = t
        freed = False
        while departures and departures[0][0] == now:
            _, i, node, gpus = heapq.heappop(departures)
            release(state, node, shaped[_key(specs[i])], gpus)
            freed = True
        if freed and queue:
            # one walk from the head suffices: a start only takes resources, so a pod passed over (or of a
            # shape passed over) in this walk cannot fit later in it
            blocked: set[tuple[int, int, int, int, str]] = set()
            left: list[int] = []
            for i in queue:
                key = _key(specs[i])
                if key in blocked or not start(i):
                    blocked.add(key)
                    left.append(i)
            queue = left
        while k < len(order) and at[order[k]] == now:
            i = order[k]
            k += 1
            if _key(specs[i]) in never:
                failed += 1
            elif not start(i):
                queue.append(i)
                max_queue = max(max_queue, len(queue))
    if queue:  # cannot happen: the last departure leaves the cluster empty, and every queued pod fits that
        raise RuntimeError(f"{len(queue)} pods still waiting after the last departure")
    horizon = now - at[order[0]]
    capacity = cluster.gpu_capacity
    return ReplayRun(
        policy=name,
        seed=seed,
        speedup=speedup,
        pods=len(pods),
        placed=sum(w is not None for w in waits),
        failed=failed,
        waits=waits,
        time_avg_alloc=100.0 * area / (capacity * horizon) if horizon > 0 else 0.0,
        horizon_s=horizon,
        peak_alloc=100.0 * peak / capacity,
        alloc_while_waiting=100.0 * backlog_area / (capacity * backlog_s) if backlog_s > 0 else None,
        backlog_s=backlog_s,
        max_queue=max_queue,
        decision_ms=placer.decision_ms,
    )


def replay_summary(run: ReplayRun) -> dict[str, object]:
    """The JSON object of ``rally sim packing --mode replay --json``."""
    waited = [w for w in run.waits if w is not None]
    waits = np.asarray(waited) if waited else np.zeros(1)
    times = np.asarray(run.decision_ms) if run.decision_ms else np.zeros(1)
    return {
        "policy": run.policy,
        "mode": "replay",
        "seed": run.seed,
        "speedup": run.speedup,
        "pods": run.pods,
        "time_avg_alloc": round(run.time_avg_alloc, 4),
        "wait_s_mean": round(float(waits.mean()), 3),
        "wait_s_p50": round(float(np.percentile(waits, 50)), 3),
        "wait_s_p95": round(float(np.percentile(waits, 95)), 3),
        "waited_pods": int(np.count_nonzero(waits > 0)),
        "failed_pods": run.failed,
        "placed_pods": run.placed,
        "max_queue": run.max_queue,
        "horizon_s": round(run.horizon_s, 3),
        "peak_alloc": round(run.peak_alloc, 4),
        "alloc_while_waiting": None if run.alloc_while_waiting is None else round(run.alloc_while_waiting, 4),
        "backlog_s": round(run.backlog_s, 3),
        "decision_ms_p99": round(float(np.percentile(times, 99)), 4),
    }


def arrival_curve(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], policy_name: str, seed: int, ratio: float = TUNE_RATIO
) -> tuple[np.ndarray, np.ndarray]:
    """The FGD protocol's replay of one seed (as ``runner.run_seed``: same arrivals, same decisions) as a
    curve: after each pod, the arrived GPU demand and the GPU allocation, both in percent of capacity."""
    cluster = Cluster(nodes)
    if cluster.gpu_capacity == 0:
        raise ValueError("the cluster has no GPUs")
    rng = np.random.default_rng(seed)
    policy = POLICIES[resolve(policy_name)](cluster, pods)
    order = arrivals(pods, cluster.gpu_capacity, rng, ratio)
    placer = Placer(cluster, policy, rng, tie_order(cluster, rng))
    shaped = {i: cluster.pod(pods[i]) for i in set(order)}
    demand = np.cumsum([pods[i].total_milli for i in order], dtype=np.float64)
    alloc = np.empty(len(order))
    for j, i in enumerate(order):
        placer.place(shaped[i])
        alloc[j] = placer.state.allocated_milli
    return 100.0 * demand / cluster.gpu_capacity, 100.0 * alloc / cluster.gpu_capacity
