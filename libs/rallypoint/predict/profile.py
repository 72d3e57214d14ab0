"""A dry run's start estimated from the last refresh's forecast, when running its own fork takes too long.

A dry run's exact answer is a run forward of the fold with its job submitted (``live.predict(only=...)``):
at 12,500 nodes and 10,000 waiting jobs each cycle of that run costs ~0.1 s of the core's time, and a gang
that waits behind hundreds of ends needs hundreds of cycles. The predictor's periodic refresh has already
run the whole queue forward once: which GPUs every job holds from when to when. :class:`Forecast` keeps
that (``Hold``: a job's whole GPUs per node over an interval), and :func:`estimate_start` fits the dry job
into it, as a backfilling scheduler fits a job into its reservations' profile (Slurm's, Maui's):

- the jobs ahead of it keep what the forecast gives them: every job running at the refresh, and every
  waiting job the policy ordered before the dry job's place (``jobs_ahead``: the dry job's position in the
  API's cycle, ``core.PendingReason.position``, against each waiting job's in the refresh's first cycle);
- the waiting jobs ordered after it are left out: the core reserves for the dry job rather than let them
  delay it (without ``jobs_ahead``, every waiting job is ahead of it);
- its start is the earliest moment, after the next change the forecast foresees (the job was found not to
  fit at the next cycle, or the predictor would not be asked), at which enough nodes of an allowed GPU type
  each have ``gpus_per_task`` whole GPUs free for each of its tasks for as long as its time limit, within
  the forecast's horizon; a job without a time limit only where nothing ahead of it comes later (the
  core backfills a job before a reservation only when its limit says it ends in time, ``core.backfill``).

What it does not model, said where it is shown (docs/prediction.md): how the order moves as the run goes on
(fair shares, attained service and quotas change as jobs start and end; the order is the one at submit),
topology rules, preemption on its behalf, fractional and
MIG requests (no estimate: ``None``), and whatever moved since the refresh it came from (its ``seq``).
Pure and deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import msgspec

__all__ = ["Forecast", "Hold", "estimate_start"]


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """Whole GPUs a job holds on each of its nodes (``gpus``: node id, count) from ``start`` to ``end``
    (None: past the run's end). ``waiting``: it was waiting when the run began (started in the run), else
    it was running then; ``rank``: a waiting job's position in the policy's order at the run's first cycle
    (-1: bound by that cycle; None: not known, or not waiting)."""

    job_id: str
    rank: int | None
    start: float
    end: float | None
    gpus: tuple[tuple[str, int], ...]
    waiting: bool


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    """One run forward's holds, from the fold at ``seq`` run from ``now`` up to ``horizon_s`` ahead, over
    the schedulable nodes (``nodes``: id -> (GPU type, GPUs))."""

    seq: int
    now: float
    horizon_s: float
    nodes: dict[str, tuple[str, int]]
    holds: tuple[Hold, ...]
    #: (the run's clock, wall seconds) of each step of the run: its set-up at ``now``, then each cycle
    costs: tuple[tuple[float, float], ...] = ()

    def cost_until(self, at: float | None) -> float:
        """Wall seconds this run took to get to ``at`` on its clock (None: never there; inf): about
        what a dry run's own run forward takes to reach a start there."""
        if at is None:
            return float("inf")
        return sum(seconds for t, seconds in self.costs if t <= at)


def estimate_start(
    forecast: Forecast,
    *,
    gpus: int,
    gpus_per_task: int,
    gpu_types: Sequence[str] | None,
    jobs_ahead: int | None,
    limit_s: float | None,
    now: float,
) -> float | None:
    """The earliest start of a job of ``gpus`` (tasks of ``gpus_per_task`` each) on ``gpu_types`` (None:
    any) with a time limit of ``limit_s`` seconds (None: none), behind the first ``jobs_ahead`` waiting
    jobs of the policy's order (None: all of them), fitted into ``forecast`` after ``now`` and after the
    next change it foresees; None when it does not fit within the horizon."""
    if gpus <= 0 or gpus_per_task <= 0 or gpus % gpus_per_task:
        return None
    tasks = gpus // gpus_per_task
    end_of_view = forecast.now + forecast.horizon_s
    allowed = {n: cap for n, (kind, cap) in forecast.nodes.items() if gpu_types is None or kind in gpu_types}
    ahead = [h for h in forecast.holds if _ahead(h, jobs_ahead)]
    changes = _changes(ahead, allowed, now)
    earliest = min((t for steps in changes.values() for t, _ in steps if t > now), default=now)
    window_s = float("inf") if limit_s is None else limit_s
    windows: list[tuple[float, float]] = []
    for node, cap in allowed.items():
        windows.extend(_start_windows(changes.get(node, ()), cap, gpus_per_task, window_s, earliest))
    start = _first_covered(windows, tasks)
    return start if start is not None and start <= end_of_view else None


def _ahead(hold: Hold, jobs_ahead: int | None) -> bool:
    """Whether the job keeps its place before the dry job: running at the refresh, or ordered before it."""
    if not hold.waiting or jobs_ahead is None:
        return True
    return hold.rank is None or hold.rank < jobs_ahead


def _changes(
    holds: Iterable[Hold], allowed: dict[str, int], now: float
) -> dict[str, list[tuple[float, int]]]:
    """Per node, its used GPUs' changes as (time, delta), sorted; a hold begun before ``now`` counts from
    ``now``."""
    steps: dict[str, list[tuple[float, int]]] = {}
    for hold in holds:
        if hold.end is not None and hold.end <= now:
            continue
        begins = max(hold.start, now)
        for node, count in hold.gpus:
            if node not in allowed:
                continue
            node_steps = steps.setdefault(node, [])
            node_steps.append((begins, count))
            if hold.end is not None:
                node_steps.append((hold.end, -count))
    for node_steps in steps.values():
        node_steps.sort()
    return steps


def _start_windows(
    steps: Sequence[tuple[float, int]], cap: int, per_task: int, runtime_s: float, earliest: float
) -> Iterable[tuple[float, float]]:
    """A node's task slots as windows of start times: for each level k (its k-th slot of ``per_task``
    GPUs), each span in which at least k * ``per_task`` GPUs stay free for ``runtime_s`` (inf: for
    good) gives the starts [span start, span end - runtime_s], none before ``earliest``."""
    free_at: list[tuple[float, int]] = []  # (from, free GPUs) as a step function, from ``earliest`` on
    used, i = 0, 0
    while i < len(steps) and steps[i][0] <= earliest:
        used += steps[i][1]
        i += 1
    free_at.append((earliest, cap - used))
    while i < len(steps):
        t = steps[i][0]
        while i < len(steps) and steps[i][0] == t:
            used += steps[i][1]
            i += 1
        free_at.append((t, cap - used))
    for level in range(1, cap // per_task + 1):
        need = level * per_task
        span_from: float | None = None
        for t, free in free_at:
            if free >= need and span_from is None:
                span_from = t
            elif free < need and span_from is not None:
                if t - runtime_s >= span_from:
                    yield span_from, t - runtime_s
                span_from = None
        if span_from is not None:
            yield span_from, float("inf")


def _first_covered(windows: Sequence[tuple[float, float]], tasks: int) -> float | None:
    """The earliest time lying in at least ``tasks`` of ``windows`` (closed intervals), or None."""
    if len(windows) < tasks:
        return None
    open_ends: list[float] = []  # ends of the windows that have begun, as a heap
    for begin, end in sorted(windows):
        while open_ends and open_ends[0] < begin:
            heapq.heappop(open_ends)
        heapq.heappush(open_ends, end)
        if len(open_ends) >= tasks:
            return begin
    return None
