"""Scheduler micro-benchmark: a synthetic 100k-GPU cluster, ~80% full, with thousands of pending gangs.

Used by ``rally bench scheduler`` and ``make bench``. This module (not the core) reads the clock and a
*seeded* ``random.Random``; everything it times is the pure ``schedule()``.
"""

from __future__ import annotations

import random
import resource
import statistics
import time
from typing import Any

from rallypoint.core import (
    ClusterModel,
    Node,
    PendingJob,
    Queue,
    Quota,
    RunningJob,
    Snapshot,
    TaskPlacement,
    policy_by_name,
    schedule,
)

__all__ = ["build_workload", "run_bench"]

CLASSES = ("production", "training-high", "training-standard", "development", "best-effort")
CLASS_WEIGHTS = (0.05, 0.15, 0.45, 0.25, 0.10)
NODES_PER_RACK = 32
RACKS_PER_SPINE = 16


def _team(rng: random.Random, teams: int) -> str:
    return f"team{rng.randrange(teams):02d}"


def build_workload(
    nodes: int, gpus_per_node: int, pending: int, seed: int, teams: int = 20, orgs: int = 4
) -> tuple[ClusterModel, tuple[PendingJob, ...], tuple[Queue, ...], float]:
    """Cluster in racks of 32 nodes (16 racks per spine), filled to ~80% with running gangs, plus
    ``pending`` jobs from a heavy-tailed size mix across teams and priority classes."""
    rng = random.Random(seed)
    now = 1_000_000.0
    ns = []
    for i in range(nodes):
        r = i // NODES_PER_RACK
        s = r // RACKS_PER_SPINE
        ns.append(
            Node(
                id=f"n{i:05d}",
                rack=f"r{r:04d}",
                spine=f"s{s:03d}",
                gpu_type="h100",
                gpus=gpus_per_node,
                cpu_milli=192000,
                memory_mib=2 << 20,
            )
        )
    cluster = ClusterModel(ns)
    jid = 0

    def add(placements: list[tuple[str, tuple[int, ...]]]) -> None:
        nonlocal jid
        g = sum(len(x) for _n, x in placements)
        start = now - rng.uniform(0, 36 * 3600)
        cluster.bind(
            RunningJob(
                id=f"run{jid:06d}",
                team=_team(rng, teams),
                priority_class=rng.choices(CLASSES, CLASS_WEIGHTS)[0],
                gpus=g,
                gpus_per_task=len(placements[0][1]),
                placements=tuple(
                    TaskPlacement(task=k, node_id=n, gpus=x) for k, (n, x) in enumerate(placements)
                ),
                start_time=start,
                expected_end=now + rng.uniform(60, 48 * 3600),
                last_checkpoint=now - rng.uniform(0, 3600),
                attained_gpu_s=0.0,
            )
        )
        jid += 1

    # ~70% of nodes fully used by gangs of 1..16 whole nodes, ~20% partly used by small jobs, ~10% empty:
    # 80% of the GPUs busy, with free GPUs both fragmented and in whole idle nodes
    kind = [0 if (u := rng.random()) < 0.70 else 1 if u < 0.90 else 2 for _ in range(nodes)]
    i = 0
    while i < nodes:
        if kind[i] == 0:
            span = 1
            want = rng.choice((1, 1, 2, 4, 8, 16))
            while span < want and i + span < nodes and kind[i + span] == 0:
                span += 1
            add([(ns[i + k].id, tuple(range(gpus_per_node))) for k in range(span)])
            i += span
            continue
        if kind[i] == 1:
            used = rng.randint(1, gpus_per_node - 1)
            idx = sorted(rng.sample(range(gpus_per_node), used))
            while idx:
                take = min(len(idx), rng.choice((1, 2, 4)))
                add([(ns[i].id, tuple(idx[:take]))])
                idx = idx[take:]
        i += 1
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    weights = (0.25, 0.15, 0.15, 0.20, 0.08, 0.07, 0.04, 0.02, 0.015, 0.01, 0.006, 0.003, 0.002)
    pend = []
    for k in range(pending):
        g = rng.choices(sizes, weights)[0]
        gpt = min(g, gpus_per_node)
        pend.append(
            PendingJob(
                id=f"pend{k:06d}",
                team=_team(rng, teams),
                priority_class=rng.choices(CLASSES, CLASS_WEIGHTS)[0],
                gpus=g,
                gpus_per_task=gpt,
                submit_time=now - rng.uniform(0, 6 * 3600),
                arrival=k,
                time_limit_s=rng.choice((None, 3600.0, 4 * 3600.0, 24 * 3600.0)),
                topology_preferred="rack" if g >= 64 else None,
            )
        )
    total = nodes * gpus_per_node
    queues = [Queue(name=f"org{o}") for o in range(orgs)]
    for t in range(teams):
        queues.append(
            Queue(
                name=f"team{t:02d}",
                parent=f"org{t % orgs}",
                quotas=(Quota(gpu_type="h100", nominal=total // teams),),
            )
        )
    return cluster, tuple(pend), tuple(queues), now


def _p50_p99(samples: list[float]) -> tuple[float, float]:
    p99 = sorted(samples)[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return statistics.median(samples), p99


def run_bench(
    nodes: int = 12500,
    gpus_per_node: int = 8,
    pending: int = 5000,
    seed: int = 1,
    cycles: int = 20,
    policy: str = "rallypoint",
) -> dict[str, Any]:
    t0 = time.perf_counter()
    cluster, pend, queues, now = build_workload(nodes, gpus_per_node, pending, seed)
    cluster.index()
    build_s = time.perf_counter() - t0
    pol = policy_by_name(policy)
    snap = Snapshot(now=now, cluster=cluster, pending=pend, queues=queues)
    times = []
    cpu_times = []  # CPU time of this process per cycle: what the cycle costs, whatever else runs
    d = schedule(snap, pol)  # warm-up
    for _ in range(cycles):
        c = time.process_time()
        t = time.perf_counter()
        d = schedule(snap, pol)
        times.append((time.perf_counter() - t) * 1000)
        cpu_times.append((time.process_time() - c) * 1000)
    tasks = sum(len(b.placements) for b in d.binds)
    p50, p99 = _p50_p99(times)
    cpu_p50, cpu_p99 = _p50_p99(cpu_times)
    gang = PendingJob(
        id="big-gang",
        team="team00",
        priority_class="production",
        gpus=4096,
        gpus_per_task=gpus_per_node,
        submit_time=now,
        arrival=10**9,
    )
    gsnap = Snapshot(now=now, cluster=cluster, pending=(gang,), queues=())
    gtimes = []
    gd = schedule(gsnap, pol)
    for _ in range(5):
        t = time.perf_counter()
        gd = schedule(gsnap, pol)
        gtimes.append((time.perf_counter() - t) * 1000)
    used = sum(j.gpus for j in cluster.running.values())
    return {
        "policy": policy,
        "nodes": nodes,
        "gpus": nodes * gpus_per_node,
        "utilization": round(used / (nodes * gpus_per_node), 4),
        "running_jobs": len(cluster.running),
        "pending": pending,
        "cycles": cycles,
        "cycle_ms": {"p50": round(p50, 2), "p99": round(p99, 2)},
        "cycle_cpu_ms": {"p50": round(cpu_p50, 2), "p99": round(cpu_p99, 2)},
        "binds_per_cycle": len(d.binds),
        "tasks_per_cycle": tasks,
        "preemptions_per_cycle": len(d.preemptions),
        "reservations_per_cycle": len(d.reservations),
        "placements_per_s": round(tasks / (p50 / 1000)) if p50 > 0 else None,
        "big_gang_place_ms": round(statistics.median(gtimes), 2),
        "big_gang_bound": bool(gd.binds),
        "build_s": round(build_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
