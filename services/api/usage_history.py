"""GPUs in use per team over time (``GET /v1/usage/history``): the dashboard's usage chart, from the log.

Computed on request from the attempt ledger the accounting routes already keep (``ledger.LedgerCache``, the
one ``/v1/usage`` reads), so a page opened late still shows what happened before it was opened, and every
API replica draws the same chart. Time is cut into buckets of ``step_s`` seconds aligned to multiples of the
step (the same buckets on every refresh); a bucket's value for a team is the average number of GPUs the
team's attempts ran on during it: the GPU-seconds ``charged_gpu_s`` charges inside the bucket (the formula of
``rally usage``, so a window's buckets add up to its usage report) over the bucket's seconds. The last
bucket ends at ``until`` (now), so it may be shorter than a step.

Bounded memory: at most ``MAX_BUCKETS`` buckets per team whatever the window (a default window of 6 hours
is drawn in at most ``TARGET_BUCKETS``), and nothing is kept between requests beyond the ledger itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from rallypoint.accounting.attempts import AttemptRecord, charged_gpu_s

#: The window shown when the caller names no start: the last 6 hours, from the first GPU use in them.
DEFAULT_WINDOW_S = 6 * 3600.0
#: An automatic step gives at most this many buckets: one a minute over the default window.
TARGET_BUCKETS = 360
#: A caller's own step is widened where it would give more than this many (a day by the minute).
MAX_BUCKETS = 1440
#: The steps an automatic choice picks from, seconds: round numbers a time axis reads well in.
NICE_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


class TeamSeries(msgspec.Struct, kw_only=True):
    team: str
    #: the average GPUs the team's attempts ran on in each bucket, in the order of ``starts``
    gpus: list[float]
    #: the GPU-seconds of the whole window (``rally usage --since ... --until ...`` of the same window)
    gpu_s: float


class UsageHistory(msgspec.Struct, kw_only=True):
    """GPUs in use per team, bucket by bucket; teams in name order."""

    since: float
    until: float
    step_s: float
    #: each bucket's start; a bucket ends at the next one's start, the last at ``until``
    starts: list[float]
    teams: list[TeamSeries]


def auto_step(span_s: float) -> int:
    """The smallest round step that draws ``span_s`` seconds in at most ``TARGET_BUCKETS`` buckets."""
    for step in NICE_STEPS:
        if span_s / step <= TARGET_BUCKETS:
            return step
    return math.ceil(span_s / TARGET_BUCKETS)  # beyond a year: whole seconds, still TARGET_BUCKETS


def first_use(records: Iterable[AttemptRecord]) -> float | None:
    """When the earliest of ``records`` started running (None: none ran)."""
    starts = [rec.started_at for rec in records if rec.started_at is not None]
    return min(starts) if starts else None


def default_since(records: list[AttemptRecord], until: float) -> float:
    """The start of the default window: ``DEFAULT_WINDOW_S`` before ``until``, or the first GPU use after
    that, so a young cluster's chart is not six hours of nothing with a spike at the end."""
    earliest = until - DEFAULT_WINDOW_S
    used = first_use(records)
    return earliest if used is None or used <= earliest else min(used, until - 1.0)


def bucket_starts(since: float, until: float, step: float) -> list[float]:
    """The starts of the buckets covering [since, until): multiples of ``step``, the first at or before
    ``since``."""
    first = float(math.floor(since / step) * step)
    count = max(1, math.ceil((until - first) / step))
    return [first + i * step for i in range(count)]


def fitting_step(span_s: float, step: int | None) -> int:
    """``step`` (None: ``auto_step``), widened where it would cut ``span_s`` into more than ``MAX_BUCKETS``
    buckets and narrowed to the span where longer (one bucket either way, and no integer too large for a
    float reaches the arithmetic): the answer's ``step_s`` says which step was used."""
    if step is None:
        return auto_step(span_s)
    return min(max(step, math.ceil(span_s / MAX_BUCKETS)), math.ceil(span_s))


def usage_history(
    records: Iterable[AttemptRecord],
    *,
    until: float,
    now: float,
    since: float | None = None,
    step_s: int | None = None,
) -> UsageHistory:
    """GPUs in use per team in [since, until), bucketed by ``step_s`` (``fitting_step``); running
    attempts count up to ``now``. ``since`` None: ``default_since``. An empty window (``until`` not after
    ``since``) has no buckets."""
    attempts = list(records)
    start = default_since(attempts, until) if since is None else since
    if until <= start:
        return UsageHistory(since=start, until=until, step_s=float(step_s or 1), starts=[], teams=[])
    step = fitting_step(until - start, step_s)
    starts = bucket_starts(start, until, step)
    ends = [*starts[1:], until]
    charged: dict[str, list[float]] = {}
    for rec in attempts:
        _charge(rec, starts, ends, step, now, charged.setdefault(rec.team, [0.0] * len(starts)))
    teams = [
        TeamSeries(
            team=team,
            gpus=[gpu_s / (end - begin) for gpu_s, begin, end in zip(per_bucket, starts, ends, strict=True)],
            gpu_s=sum(per_bucket),
        )
        for team, per_bucket in sorted(charged.items())
        if any(per_bucket)
    ]
    return UsageHistory(since=starts[0], until=until, step_s=float(step), starts=starts, teams=teams)


def _charge(
    rec: AttemptRecord, starts: list[float], ends: list[float], step: int, now: float, into: list[float]
) -> None:
    """Add ``rec``'s GPU-seconds to each bucket it ran in (only those: a short attempt costs a few)."""
    if rec.started_at is None:
        return
    stop = rec.ended_at if rec.ended_at is not None else now
    first = max(0, math.floor((rec.started_at - starts[0]) / step))
    last = min(len(starts) - 1, math.floor((stop - starts[0]) / step))
    for i in range(first, last + 1):
        into[i] += charged_gpu_s(rec, starts[i], ends[i], now)
