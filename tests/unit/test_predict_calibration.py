"""The P90 start's calibration (rallypoint.predict.calibration): the P90 run's wait scaled by what the
resolved predictions say, so that about 90% of jobs start within it, and nothing before enough of them."""

from __future__ import annotations

import pytest

from rallypoint.predict.calibration import WaitCalibrator


def test_the_p90_run_is_kept_until_enough_predictions_are_resolved() -> None:
    calibrator = WaitCalibrator(min_resolved=5)
    for _ in range(4):
        calibrator.resolve(0.0, 100.0, 400.0)  # each started at 4x its predicted P90 wait
    assert calibrator.factor() == 1.0 and calibrator.resolved == 4
    assert calibrator.p90(1000.0, 1050.0, 1100.0) == 1100.0
    calibrator.resolve(0.0, 100.0, 400.0)
    assert calibrator.factor() == pytest.approx(4.0)
    assert calibrator.p90(1000.0, 1050.0, 1100.0) == pytest.approx(1400.0)


def test_the_factor_covers_the_target_share_of_recent_predictions() -> None:
    calibrator = WaitCalibrator(window=100, min_resolved=10)
    # waits that came out at 0.1x .. 10x the P90 run's: 90% of them at 9x or less
    for i in range(1, 101):
        calibrator.resolve(1000.0, 1100.0, 1000.0 + 10.0 * i)
    assert calibrator.factor() == pytest.approx(9.0)
    p90 = calibrator.p90(1000.0, None, 1100.0)
    assert p90 is not None and sum(1000.0 + 10.0 * i <= p90 for i in range(1, 101)) == 90
    # only the last ``window`` count: a run that became right brings the factor back
    for _ in range(100):
        calibrator.resolve(0.0, 100.0, 90.0)
    assert calibrator.factor() == pytest.approx(0.9)


def test_a_calibrated_p90_is_never_before_the_p50_and_none_stays_none() -> None:
    calibrator = WaitCalibrator(min_resolved=1)
    calibrator.resolve(0.0, 100.0, 10.0)  # the P90 run was 10x too pessimistic
    assert calibrator.p90(0.0, 80.0, 100.0) == 80.0  # 10 s scaled, but the P50 start is at 80
    assert calibrator.p90(0.0, None, None) is None
    with pytest.raises(ValueError):
        WaitCalibrator(target=1.0)
