"""The figures of ``rally sim predict``: how close the predicted starts and runtimes came.

Start errors are |predicted P50 start - actual start|; a job the forward run never started counts as an
infinite error. ``p90_coverage`` is the share of jobs that started no later than their P90 start (a
calibrated P90 covers about 90%). Runtime figures compare the estimator's P50 at submit with the job's
runtime: within 50% (|estimate - runtime| <= runtime / 2) and off by 2x or more (estimate >= 2 x runtime
or <= runtime / 2), as Helios and 3Sigma count them. ``started_at_submit`` is the share of jobs whose start
was known at submit (the core started them in that instant): every predictor gets those right, and
every one of them is covered by its P90. So the P90's calibration shows on the others alone:
``predicted_jobs`` (not started at submit), their ``predicted_p90_coverage`` (the calibrated P90 the
predictions show) and ``predicted_p90_run_coverage`` (the P90 run's own start, uncalibrated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median

from .starts import Prediction

__all__ = ["WAITED_S", "accuracy"]

WAITED_S = 600.0  # a job "waited" when it started 10 minutes or more after its submit


def _error(predicted: float | None, actual: float) -> float:
    return math.inf if predicted is None else abs(predicted - actual)


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _within(errors: Sequence[float], limit_s: float) -> float | None:
    return _share([e <= limit_s for e in errors])


def accuracy(predictions: Sequence[Prediction]) -> dict[str, float | int | None]:
    """One object of figures over the jobs that started in the replay."""
    done = [p for p in predictions if p.start is not None]
    errors = [_error(p.p50, p.start) for p in done if p.start is not None]
    base = [_error(p.baseline, p.start) for p in done if p.start is not None]
    waited = [p for p in done if p.start is not None and p.start - p.submit >= WAITED_S]
    waited_errors = [_error(p.p50, p.start) for p in waited if p.start is not None]
    covered = [p.p90 is not None and p.start is not None and p.start <= p.p90 for p in done]
    predicted = [p for p in done if p.start != p.submit]
    covered_run = [p.p90_run is not None and p.start is not None and p.start <= p.p90_run for p in predicted]
    ratio = [p.runtime_p50 / p.duration for p in done]
    return {
        "jobs": len(done),
        "started_at_submit": _share([p.start == p.submit for p in done]),
        "within_1min": _within(errors, 60.0),
        "within_10min": _within(errors, 600.0),
        "median_abs_error_s": median(errors) if errors else None,
        "p90_coverage": _share(covered),
        "predicted_jobs": len(predicted),
        "predicted_p90_coverage": _share(
            [p.p90 is not None and p.start is not None and p.start <= p.p90 for p in predicted]
        ),
        "predicted_p90_run_coverage": _share(covered_run),
        "waited_jobs": len(waited),
        "waited_within_1min": _within(waited_errors, 60.0),
        "waited_within_10min": _within(waited_errors, 600.0),
        "baseline_within_1min": _within(base, 60.0),
        "baseline_within_10min": _within(base, 600.0),
        "baseline_median_abs_error_s": median(base) if base else None,
        "runtime_within_50pct": _share([abs(r - 1.0) <= 0.5 for r in ratio]),
        "runtime_off_2x": _share([r >= 2.0 or r <= 0.5 for r in ratio]),
        "not_started": len(predictions) - len(done),
    }
