"""How good the live predictions were: each job's first predicted start and runtime estimate, checked
against what happened (the predictor's ``/metrics`` and ``q.predictor.starts`` carry the counts).

A job is counted once for its start (when it first starts, against the first P50 and P90 start predicted
for it) and once for its runtime (when it completes, against the P50 runtime estimated at its first
prediction). A job that started without ever being predicted (it started at once) counts for neither.
"""

from __future__ import annotations

import msgspec

from .live import PredictedStart, Predictions

__all__ = ["Accuracy", "AccuracyTracker"]

ONE_MINUTE_S = 60.0
TEN_MINUTES_S = 600.0


class Accuracy(msgspec.Struct, kw_only=True):
    """Counts since the predictor started; the shares are what ``docs/prediction.md`` defines."""

    starts: int = 0
    starts_within_1min: int = 0
    starts_within_10min: int = 0
    started_before_p90: int = 0
    runtimes: int = 0
    runtimes_within_50pct: int = 0
    runtimes_off_2x: int = 0

    def shares(self) -> dict[str, float | None]:
        def share(part: int, whole: int) -> float | None:
            return None if whole == 0 else round(part / whole, 4)

        return {
            "within_1min": share(self.starts_within_1min, self.starts),
            "within_10min": share(self.starts_within_10min, self.starts),
            "p90_coverage": share(self.started_before_p90, self.starts),
            "runtime_within_50pct": share(self.runtimes_within_50pct, self.runtimes),
            "runtime_off_2x": share(self.runtimes_off_2x, self.runtimes),
        }


class AccuracyTracker:
    """First predictions by job, scored as the jobs start and end."""

    def __init__(self) -> None:
        self.accuracy = Accuracy()
        self._starts: dict[str, PredictedStart] = {}
        self._runtimes: dict[str, float] = {}

    def remember(self, predictions: Predictions) -> None:
        """Keep the first prediction of each job in ``predictions`` (and its P50 runtime estimate)."""
        for job_id, start in predictions.jobs.items():
            if start.p50 is not None:
                self._starts.setdefault(job_id, start)
            self._runtimes.setdefault(job_id, start.runtime_p50_s)

    def started(self, job_id: str, at: float) -> None:
        predicted = self._starts.pop(job_id, None)
        if predicted is None or predicted.p50 is None:
            return
        error = abs(at - predicted.p50)
        a = self.accuracy
        a.starts += 1
        a.starts_within_1min += error <= ONE_MINUTE_S
        a.starts_within_10min += error <= TEN_MINUTES_S
        a.started_before_p90 += predicted.p90 is not None and at <= predicted.p90

    def completed(self, job_id: str, runtime_s: float) -> None:
        estimate = self._runtimes.pop(job_id, None)
        if estimate is None or runtime_s <= 0:
            return
        a = self.accuracy
        a.runtimes += 1
        a.runtimes_within_50pct += abs(estimate - runtime_s) <= 0.5 * runtime_s
        a.runtimes_off_2x += estimate >= 2 * runtime_s or estimate <= runtime_s / 2

    def forget(self, job_id: str) -> None:
        """A job that ended without completing (failed, cancelled, rejected) scores nothing."""
        self._starts.pop(job_id, None)
        self._runtimes.pop(job_id, None)
