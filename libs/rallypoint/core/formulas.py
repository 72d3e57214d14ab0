"""The core's small formulas, each written once: every caller (hot loops included) calls these.

They run once per job in the cycle's hot loops, so they are plain functions on plain values: no
allocation beyond their result, no attribute lookups they can avoid. A fast path calls them; it does not
copy them: a copy drifts (the memoized attained-service level once skipped thresholds at or below 0 that
``pending_level`` counted).

- :func:`runtime_estimate`: learned runtime, else time limit, else unknown;
- :func:`las_level` / :func:`las_levels`: Tiresias' discretized attained-service level (thresholds
  reached);
- :func:`estimate_level` / :func:`estimate_levels`: the level of expected remaining work (one per
  doubling above a unit, exact on every platform); :func:`pending_remaining` is a waiting job's
  expected remaining work;
- :func:`starving`: the LAS starvation guard (waited longer than a factor x its last run);
- :func:`aging_boost`: the priority a waiting job gains by aging;
- :func:`dominant_share`: a team's weighted DRF dominant share;
- :func:`add_team_usage`: a team's (GPUs, CPU milli, memory MiB) usage sum;
- :func:`job_types`: the GPU types a pending job may bind on, in the order to try them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rallypoint.core.cluster import ClusterIndex
    from rallypoint.core.types import PendingJob

__all__ = [
    "LEVEL_SPAN",
    "add_team_usage",
    "aging_boost",
    "dominant_share",
    "estimate_level",
    "estimate_levels",
    "job_types",
    "las_level",
    "las_levels",
    "pending_remaining",
    "runtime_estimate",
    "starving",
]

LEVEL_SPAN = 64  # LAS levels are 0..63 (a preemption rank packs them in 6 bits)
_frexp = math.frexp


def runtime_estimate(job: PendingJob) -> float | None:
    """Learned runtime when known, else the time limit, else unknown (None)."""
    rt = job.expected_runtime_s
    return rt if rt is not None else job.time_limit_s


def pending_remaining(job: PendingJob) -> float:
    """Expected remaining GPU-seconds of a waiting job: GPUs x its runtime estimate, else (no estimate)
    its attained GPU-seconds (it is expected to run about as long again as it has)."""
    est = job.expected_runtime_s
    if est is None:
        est = job.time_limit_s
    return job.gpus * est if est is not None else job.attained_gpu_s


def las_level(attained: float, thresholds: tuple[float, ...]) -> int:
    """Number of ``thresholds`` that ``attained`` GPU-seconds reached (uncapped)."""
    k = 0
    for th in thresholds:
        if attained >= th:
            k += 1
    return k


def las_levels(attained: np.ndarray, thresholds: tuple[float, ...]) -> np.ndarray:
    """:func:`las_level` of every entry, as float64 (uncapped)."""
    level = np.zeros(len(attained), np.float64)
    for th in thresholds:
        level += attained >= th
    return level


def estimate_level(rem_gpu_s: float, unit: float) -> int:
    """Level of ``rem_gpu_s`` expected remaining GPU-seconds: 0 below ``unit``, then one per doubling.

    ``math.frexp`` gives the binary exponent exactly (a ``log2`` could round across a level boundary), so
    the level is bit-for-bit the same on every platform, and equal to :func:`estimate_levels`."""
    r = rem_gpu_s / unit
    if not r >= 1.0:  # (NaN: no estimate, level 0)
        return 0
    k = _frexp(r)[1]
    return k if k < LEVEL_SPAN - 1 else LEVEL_SPAN - 1


def estimate_levels(rem_gpu_s: np.ndarray, unit: float) -> np.ndarray:
    """:func:`estimate_level` of every entry."""
    r = rem_gpu_s / unit
    with np.errstate(invalid="ignore"):
        return np.where(r >= 1.0, np.minimum(np.frexp(r)[1], LEVEL_SPAN - 1), 0).astype(np.float64)


def starving(job: PendingJob, now: float, factor: float) -> bool:
    """LAS starvation guard: ``job`` waited more than ``factor`` x its last run (``factor`` > 0)."""
    return factor > 0 and job.last_run_s > 0 and now - job.submit_time > factor * job.last_run_s


def aging_boost(waited: float, step: int, interval: float, cap: int | None) -> int:
    """Priority gained by waiting ``waited`` seconds: ``step`` per whole ``interval``, at most ``cap``
    (None: no cap). Asked only with ``step`` > 0 and ``interval`` > 0."""
    boost = int(max(0.0, waited) // interval) * step
    if cap is not None and cap < boost:
        return cap
    return boost


def dominant_share(usage: tuple[int, int, int], totals: tuple[int, int, int], weight_div: float) -> float:
    """Weighted DRF dominant share: max(GPUs / total, CPU / total, memory / total) / ``weight_div``
    (``weight_div`` = max(team weight, 1e-9)). Written without the ``max`` builtin (same result: the first
    largest wins)."""
    ug, uc, um = usage
    tg, tc, tm = totals
    sh = ug / tg
    c = uc / tc
    if c > sh:
        sh = c
    m = um / tm
    if m > sh:
        sh = m
    return sh / weight_div


def add_team_usage(
    team_usage: dict[str, tuple[int, int, int]], team: str, gpus: int, cpu_milli: int, memory_mib: int
) -> None:
    """Add (``gpus``, ``cpu_milli``, ``memory_mib``) to ``team``'s usage sum in ``team_usage``."""
    g, c, m = team_usage.get(team, (0, 0, 0))
    team_usage[team] = (g + gpus, c + cpu_milli, m + memory_mib)


def job_types(job: PendingJob, idx: ClusterIndex) -> list[str]:
    """The GPU types ``job`` may bind on, in the order to try them: its ``gpu_types`` that the cluster
    has (in the job's order, first occurrence), else ``[gpu_type]`` (even when the cluster lacks it: the
    capacity check says so), else every type of the cluster (``idx.types`` itself: do not modify)."""
    alts = job.gpu_types
    if alts is None:
        g = job.gpu_type
        return idx.types if g is None else [g]
    have = idx.type_capacity
    out: list[str] = []
    for t in alts:
        if t in have and t not in out:
            out.append(t)
    return out
