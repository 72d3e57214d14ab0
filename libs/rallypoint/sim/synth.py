"""Seeded synthetic workloads and clusters, for benchmarks and what-if runs at scales no trace reaches."""

from __future__ import annotations

import math
import random

import msgspec

from rallypoint.scheduling.queues import Cohort, Queues, Team

from .cluster import Cluster, ClusterFile, Generator, build_cluster
from .workload import Job

# Gang sizes and their shares, shaped like the public traces (mostly small jobs) with a tail of big gangs.
SIZES: tuple[tuple[int, float], ...] = (
    (1, 0.55),
    (2, 0.08),
    (4, 0.08),
    (8, 0.16),
    (16, 0.05),
    (32, 0.03),
    (64, 0.025),
    (128, 0.015),
    (256, 0.007),
    (512, 0.003),
)
MIX = (("training-high", 0.1), ("training-standard", 0.6), ("best-effort", 0.3))


def synth_cluster(
    gpus: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 32,
    racks_per_spine: int = 16,
    gpu_type: str = "H100",
) -> Cluster:
    racks = max(1, gpus // (gpus_per_node * nodes_per_rack))
    return build_cluster(
        ClusterFile(
            generator=Generator(
                racks=racks,
                nodes_per_rack=nodes_per_rack,
                gpus_per_node=gpus_per_node,
                gpu_type=gpu_type,
                racks_per_spine=racks_per_spine,
            )
        )
    )


def _pick(
    rng: random.Random, table: tuple[tuple[int, float], ...] | tuple[tuple[str, float], ...]
) -> int | str:
    u = rng.random() * sum(w for _, w in table)
    for v, w in table:
        u -= w
        if u < 0:
            return v
    return table[-1][0]


def synth_day(
    jobs: int, cluster_gpus: int, teams: int = 16, load: float = 0.9, span: float = 86400.0, seed: int = 0
) -> tuple[list[Job], Queues]:
    """``jobs`` jobs arriving as a Poisson process over ``span``; durations lognormal (median 20 min, long
    tail), then scaled by one factor so the offered load is ``load``. Equal quotas over ``teams`` teams."""
    rng = random.Random(seed)
    max_size = max(s for s, _ in SIZES if s <= cluster_gpus)
    out: list[Job] = []
    t = 0.0
    rate = jobs / span
    for i in range(jobs):
        t += rng.expovariate(rate)
        size = min(int(_pick(rng, SIZES)), max_size)
        dur = min(math.exp(rng.gauss(math.log(1200.0), 1.6)), 7 * 86400.0)
        out.append(
            Job(
                id=f"s{i:07d}",
                submit=float(int(t)),
                gpus=size,
                duration=dur,
                team=f"team{rng.randrange(teams):02d}",
                priority=str(_pick(rng, MIX)),
                checkpoint_interval=1800.0,
            )
        )
    work = sum(j.gpus * j.duration for j in out)
    factor = load * cluster_gpus * span / work
    final = []
    for j in out:
        d = float(max(1, round(j.duration * factor)))
        final.append(msgspec.structs.replace(j, duration=d, time_limit=d * 1.5))
    nominal = cluster_gpus // teams
    q = Queues(
        teams=[Team(name=f"team{k:02d}", nominal=nominal, cohort="all") for k in range(teams)],
        cohorts=[Cohort(name="all")],
    )
    return final, q
