"""The P90 start's calibration (rallypoint.predict.calibration): the P90 run's wait scaled by what the
resolved predictions say, so that about 90% of jobs start within it, and nothing before enough of them."""

from __future__ import annotations

import pytest

from rallypoint.predict.calibration import WaitCalibrator


def resolve(calibrator: WaitCalibrator, job_id: str, at: float, p90: float, started: float) -> None:
    calibrator.predicted(job_id, at, p90)
    calibrator.started(job_id, started)


def test_the_p90_run_is_kept_until_enough_predictions_are_resolved() -> None:
    calibrator = WaitCalibrator(min_resolved=5)
    for i in range(4):
        resolve(calibrator, f"j{i}", 0.0, 100.0, 400.0)  # each started at 4x its predicted P90 wait
    assert calibrator.calibrate(500.0) == 1.0 and calibrator.resolved == 4
    assert calibrator.p90(1000.0, 1050.0, 1100.0) == 1100.0
    resolve(calibrator, "j4", 0.0, 100.0, 400.0)
    assert calibrator.calibrate(500.0) == pytest.approx(4.0) == calibrator.factor()
    assert calibrator.p90(1000.0, 1050.0, 1100.0) == pytest.approx(1400.0)


def test_the_factor_covers_the_target_share_of_recent_predictions() -> None:
    calibrator = WaitCalibrator(window=100, min_resolved=10)
    # waits that came out at 0.1x .. 10x the P90 run's: 90% of them at 9x or less
    for i in range(1, 101):
        resolve(calibrator, f"j{i}", 1000.0, 1100.0, 1000.0 + 10.0 * i)
    assert calibrator.calibrate(5000.0) == pytest.approx(9.0)
    p90 = calibrator.p90(1000.0, None, 1100.0)
    assert p90 is not None and sum(1000.0 + 10.0 * i <= p90 for i in range(1, 101)) == 90
    # only the last ``window`` count: a run that became right brings the factor back
    for i in range(100):
        resolve(calibrator, f"k{i}", 0.0, 100.0, 90.0)
    assert calibrator.calibrate(5000.0) == pytest.approx(0.9)


def test_jobs_still_waiting_past_the_factor_count_as_the_misses_they_already_are() -> None:
    calibrator = WaitCalibrator(window=100, min_resolved=10)
    for i in range(20):
        resolve(calibrator, f"j{i}", 0.0, 100.0, 100.0)  # the P90 run was right so far: factor 1
    for i in range(10):
        calibrator.predicted(f"w{i}", 1000.0, 1100.0)  # waiting since 1000, P90 run said 1100
    assert calibrator.calibrate(1100.0) == pytest.approx(1.0)  # not late yet
    # at 1500 they have waited 5x their P90 run's wait: a third of the record, and beyond the 0.9 quantile
    assert calibrator.calibrate(1500.0) == pytest.approx(5.0)
    for i in range(10):
        calibrator.forget(f"w{i}")  # cancelled while waiting: nothing to learn
    assert calibrator.calibrate(1500.0) == pytest.approx(1.0)
    calibrator.started("never-predicted", 1500.0)
    assert calibrator.resolved == 20


def test_a_calibrated_p90_is_never_before_the_p50_and_none_stays_none() -> None:
    calibrator = WaitCalibrator(min_resolved=1)
    resolve(calibrator, "j", 0.0, 100.0, 10.0)  # the P90 run was 10x too pessimistic
    calibrator.calibrate(10.0)
    assert calibrator.p90(0.0, 80.0, 100.0) == 80.0  # 10 s scaled, but the P50 start is at 80
    assert calibrator.p90(0.0, None, None) is None
    with pytest.raises(ValueError):
        WaitCalibrator(target=1.0)
