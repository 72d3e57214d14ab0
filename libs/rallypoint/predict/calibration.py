"""The P90 start calibrated on the predictor's own record: online, from predictions already resolved.

The P90 run (every job at its P90 runtime) knows only the jobs there are now: jobs that arrive later and
go ahead (a higher class, a team under its quota, a preemption) move a start back, and no runtime
quantile accounts for them. So on a busy cluster far fewer than 90% of jobs start by their P90 run's
start. :class:`WaitCalibrator` corrects that the way split conformal prediction does: for each job whose
start is known, the ratio of its actual wait to the wait its P90 run predicted (both from the moment of
the prediction); a new prediction's P90 wait is scaled by the ``target`` quantile of the last ``window``
such ratios, and of the jobs still waiting that are already later than that (a lower bound of their
ratio: a known miss). It learns only from what has happened by the moment it answers for, so it is as
honest as the runtimes it rides on, and it needs no knowledge of the workload: where the P90 run is
already right, the factor stays near 1. Waits are not exchangeable (a congestion builds up, then clears),
so the coverage it reaches is below its target where they change fastest (docs/prediction.md).

Until ``min_resolved`` predictions are resolved the factor is 1 (the P90 run's own start).
"""

from __future__ import annotations

import math
from collections import deque

from .runtimes import quantile

__all__ = ["WaitCalibrator"]

#: The shortest wait a ratio is taken over: a start predicted for the very moment of the prediction.
_MIN_WAIT_S = 1.0


class WaitCalibrator:
    """The factor predicted P90 waits are scaled by, from the last ``window`` resolved predictions and
    the predictions still waiting that are already known to be late."""

    def __init__(self, window: int = 256, min_resolved: int = 10, target: float = 0.9) -> None:
        if window < 1 or not 1 <= min_resolved <= window or not 0 < target < 1:
            raise ValueError("need window >= 1, 1 <= min_resolved <= window, 0 < target < 1")
        self.target = target
        self.min_resolved = min_resolved
        self._ratios: deque[float] = deque(maxlen=window)
        self._waiting: dict[str, tuple[float, float]] = {}  # job -> (predicted at, its P90 run's start)
        self._factor = 1.0

    @property
    def resolved(self) -> int:
        """How many resolved predictions the factor comes from (at most ``window``)."""
        return len(self._ratios)

    def factor(self) -> float:
        """The scale of a P90 wait as of the last ``calibrate``: 1 before enough resolved predictions."""
        return self._factor

    def predicted(self, job_id: str, at: float, p90: float | None) -> None:
        """``job_id``'s first prediction, made at ``at``: its P90 run's start (None: none to learn from)."""
        if p90 is not None:
            self._waiting.setdefault(job_id, (at, p90))

    def started(self, job_id: str, at: float) -> None:
        """``job_id`` started at ``at``: its prediction, if it had one, is resolved."""
        first = self._waiting.pop(job_id, None)
        if first is not None:
            self._ratios.append(_ratio(*first, at))

    def forget(self, job_id: str) -> None:
        """``job_id`` ended without starting: its prediction can never be resolved."""
        self._waiting.pop(job_id, None)

    def calibrate(self, now: float) -> float:
        """The factor as of ``now``: the ``target`` quantile of the resolved ratios, together with the
        predictions still waiting at ``now`` whose ratio is already above it (a lower bound of theirs: they
        are known misses, and leaving them out until they start would learn of a congestion only after
        it). 1 before ``min_resolved`` predictions are resolved."""
        if len(self._ratios) < self.min_resolved:
            self._factor = 1.0
            return self._factor
        resolved = quantile(sorted(self._ratios), self.target)
        late = [r for at, p90 in self._waiting.values() if (r := _ratio(at, p90, now)) > resolved]
        self._factor = quantile(sorted([*self._ratios, *late]), self.target) if late else resolved
        return self._factor

    def p90(self, now: float, p50: float | None, p90: float | None) -> float | None:
        """The calibrated P90 start of a prediction made at ``now``: its P90 run's wait scaled by the
        factor, never before its P50 start (None stays None: not within the horizon)."""
        if p90 is None:
            return None
        scaled = now + self._factor * (p90 - now)
        if not math.isfinite(scaled):
            return None
        return scaled if p50 is None else max(p50, scaled)


def _ratio(at: float, p90: float, started_at: float) -> float:
    """The wait from ``at`` to ``started_at`` over the P90 run's wait from ``at``."""
    return max(0.0, started_at - at) / max(_MIN_WAIT_S, p90 - at)
