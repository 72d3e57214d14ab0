"""Offered load and the two ways of setting it: scale the cluster, or compress arrivals.

Offered load = GPU-seconds submitted / (cluster GPUs x window length). The window length is the span the
jobs were drawn from (e.g. one week), not first-to-last submit, so a quiet tail counts as capacity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from rallypoint.sim.workload import Job


def work(jobs: Sequence[Job]) -> float:
    return sum(j.gpus * j.duration for j in jobs)


def offered_load(jobs: Sequence[Job], gpus: int, window: float) -> float:
    return work(jobs) / (gpus * window) if gpus and window > 0 else math.inf


def gpus_for_load(
    jobs: Sequence[Job], window: float, target: float, gpus_per_node: int = 8, min_gpus: int = 0
) -> int:
    """Smallest whole-node GPU count whose offered load is <= ``target`` (and that fits the biggest job)."""
    need = work(jobs) / (target * window)
    biggest = max((j.gpus for j in jobs), default=0)
    gpus = max(need, float(biggest), float(min_gpus))
    return math.ceil(gpus / gpus_per_node - 1e-9) * gpus_per_node


def compress_arrivals(
    jobs: Sequence[Job], gpus: int, window: float, target: float, integer_seconds: bool = True
) -> tuple[list[Job], float]:
    """Scale submit times by one factor so the offered load over the shrunk window is ``target``.

    Returns the jobs and the new window length. Durations are untouched: only arrivals get denser.
    """
    factor = offered_load(jobs, gpus, window) / target
    out = []
    for j in jobs:
        s = j.submit * factor
        out.append(msgspec.structs.replace(j, submit=float(math.floor(s)) if integer_seconds else s))
    return out, window * factor


def split_quota(total: int, sizes: dict[str, float]) -> dict[str, int]:
    """Split ``total`` GPUs over teams in proportion to ``sizes`` (largest remainder, deterministic)."""
    if not sizes:
        return {}
    s = sum(sizes.values())
    exact = {k: total * v / s for k, v in sizes.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out
