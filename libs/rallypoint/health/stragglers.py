"""Straggler detection: a rank whose step time stays above k x its own gang's median. Pure.

Relative to the gang's peers, never to an absolute number, so a slow model (every rank slow alike) is not
a straggler. The default k is NVIDIA's resiliency extension (nvidia-resiliency-ext straggler detection):
a rank whose performance score (peer median / its own time) falls below 0.7 is flagged, i.e. its time is
above 1 / 0.7 ~ 1.43 x the median. The window is sized from Falcon (ATC'25, >10k GPUs): fail-slow episodes
last from tens of seconds to ~10 h; replacing a node costs a checkpoint-restart (minutes), so an episode
shorter than the window is not worth acting on, and one longer is.

Each rank's time over the window is the median of its reports (one odd step, a checkpoint or an eval
pause, moves no median); a node is as slow as its slowest rank.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

import msgspec

__all__ = ["RankStep", "Straggler", "StragglerPolicy", "find_stragglers"]


class RankStep(msgspec.Struct, frozen=True, kw_only=True):
    """One progress report of one rank (the heartbeat's ``RankStatus.step_time_s``), stamped ``at``."""

    job_id: str
    node_id: str
    rank: int
    at: float
    step_time_s: float


class StragglerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    #: Flag above k x the gang median: 1 / 0.7, NVIDIA resiliency extension's score threshold.
    k: float = 1 / 0.7
    #: Falcon (ATC'25): fail-slow lasts tens of seconds to ~10 h; 5 min outlasts the blips, not the episodes.
    window_s: float = 300.0
    #: A rank's reports must span this share of the window: "stays above for the window", not "was once".
    min_cover: float = 0.8
    #: Reports a rank needs in the window before its median counts.
    min_reports: int = 3
    #: Fewer ranks than this: no verdict. With two, the median is their mean, a rank must be k / (2 - k)
    #: (~2.5x at the default k) slower to show, and there is no majority to say which of the two is wrong.
    min_ranks: int = 3


class Straggler(msgspec.Struct, frozen=True, kw_only=True):
    """The evidence for one straggling node: its slowest rank's median step time against the gang's."""

    node_id: str
    job_id: str
    rank: int
    step_time_s: float
    gang_median_s: float
    k: float
    window_s: float
    reports: int


def _rank_medians(
    reports: list[RankStep], now: float, policy: StragglerPolicy
) -> dict[tuple[str, int], tuple[float, int]]:
    """(node, rank) -> (median step time, reports) for ranks whose reports cover the window."""
    by_rank: dict[tuple[str, int], list[RankStep]] = defaultdict(list)
    for r in reports:
        by_rank[(r.node_id, r.rank)].append(r)
    out: dict[tuple[str, int], tuple[float, int]] = {}
    for key, rs in by_rank.items():
        span = max(r.at for r in rs) - min(r.at for r in rs)
        if len(rs) >= policy.min_reports and span >= policy.min_cover * policy.window_s:
            out[key] = (statistics.median(sorted(r.step_time_s for r in rs)), len(rs))
    return out


def _gang_stragglers(
    job_id: str, reports: list[RankStep], now: float, policy: StragglerPolicy
) -> list[Straggler]:
    medians = _rank_medians(reports, now, policy)
    if len(medians) < policy.min_ranks:
        return []
    gang = statistics.median(sorted(m for m, _ in medians.values()))
    slowest: dict[str, tuple[float, int, int]] = {}  # node -> (time, rank, reports)
    for (node_id, rank), (median, count) in sorted(medians.items()):
        if median > policy.k * gang and (node_id not in slowest or median > slowest[node_id][0]):
            slowest[node_id] = (median, rank, count)
    return [
        Straggler(
            node_id=node_id,
            job_id=job_id,
            rank=rank,
            step_time_s=median,
            gang_median_s=gang,
            k=policy.k,
            window_s=policy.window_s,
            reports=count,
        )
        for node_id, (median, rank, count) in sorted(slowest.items())
    ]


def find_stragglers(steps: Iterable[RankStep], now: float, policy: StragglerPolicy) -> tuple[Straggler, ...]:
    """Every straggling (node, job) in the window ending at ``now``, sorted by node then job.

    ``step_time_s`` should be the rank's own compute time per step, not the wall time between steps: in a
    synchronous gang every rank waits for the slowest at the all-reduce, so wall times are all alike and a
    straggler shows only as a uniformly slow gang.
    """
    by_job: dict[str, list[RankStep]] = defaultdict(list)
    for s in steps:
        if now - policy.window_s <= s.at <= now:
            by_job[s.job_id].append(s)
    found = [st for job_id in sorted(by_job) for st in _gang_stragglers(job_id, by_job[job_id], now, policy)]
    return tuple(sorted(found, key=lambda s: (s.node_id, s.job_id)))
