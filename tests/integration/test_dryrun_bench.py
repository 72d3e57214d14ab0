"""`rally bench dryrun` runs end to end at a small size (a real nats-server, the real API on a real port)
and its JSON has the figures docs/benchmarks.md quotes (issue 33, Build item 3), without a predictor and
with the predictor service's query handlers beside the API."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from rallypoint.bench.dryrunbench import run
from rallypoint.cli.main import main


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    # no time for a dry run's own run forward after the refresh: every one is fitted into its forecast
    cfg = argparse.Namespace(nodes=200, pending=100, runs=8, seed=1, predictor_budget=None, exact_budget=0.0)
    return run(cfg, settle=False)  # the test runner's heap is not the bench's to freeze


def test_the_dry_run_bench_times_dry_runs_that_append_nothing(figures: dict[str, Any]) -> None:
    assert (figures["nodes"], figures["pending"], figures["dry_runs"]) == (200, 100, 8)
    assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert figures["first_ms"] > 0 and figures["cpu_ms_per_dry_run"] > 0
    assert figures["placed"] + figures["waiting"] + figures["refused"] == 8 and figures["refused"] == 0
    assert figures["appended"] == 0 and figures["log_position"] == figures["events"]
    assert figures["running"] > 0 and "load_1m_before" in figures
    # the settled cluster places none of them; no predictor ran beside the API
    assert figures["placed"] == 0 and figures["predicted_start"] == ["unavailable"]


def test_the_dry_run_bench_times_dry_runs_with_their_predicted_start_too(figures: dict[str, Any]) -> None:
    predicted = figures["with_prediction"]  # the predictor service's handlers beside the API
    assert predicted["dry_runs"] == 8  # two of each shape
    assert 0 < predicted["p50_ms"] <= predicted["p95_ms"] <= predicted["max_ms"]
    assert 0 < predicted["predictor"]["p50_ms"] <= predicted["predictor"]["max_ms"]
    # every one waits and gets a prediction (the 1,024-GPU gang's run forward, the longest, may outlast
    # the API's 2 s on a loaded machine)
    assert predicted["now"] == 0 and predicted["predicted"] >= 6 and predicted["beyond-horizon"] == 0
    assert predicted["predicted"] + predicted["unavailable"] == 8
    shapes = predicted["by_shape"]
    assert list(shapes) == ["1_gpus", "8_gpus", "64_gpus", "1024_gpus"]
    assert shapes["1_gpus"]["statuses"] == {"predicted": 2} and len(shapes["8_gpus"]["ms"]) == 2
    # a larger gang waits longer: more of the full cluster must end first
    assert 0 < shapes["8_gpus"]["p50_wait_s"] < shapes["64_gpus"]["p50_wait_s"]


def test_after_a_refresh_a_dry_run_past_its_exact_budget_is_fitted_into_the_forecast(
    figures: dict[str, Any],
) -> None:
    forecast = figures["with_forecast"]  # one refresh of the predictor first, then no exact budget
    assert forecast["dry_runs"] == 8 and forecast["refresh_s"] > 0 and forecast["refresh_predicted"] > 0
    assert forecast["estimated"] == 8 and forecast["unavailable"] == 0 and forecast["predicted"] == 0
    during = forecast["during_refresh"]  # the same dry runs while the next refresh runs beside them
    assert during["estimated"] == 8 and during["unavailable"] == 0
    assert 0 < during["p50_ms"] <= during["max_ms"]
    shapes = forecast["by_shape"]
    # the forecast's starts: later for the larger gangs, as the runs forward found them
    assert 0 < shapes["8_gpus"]["p50_wait_s"] < shapes["1024_gpus"]["p50_wait_s"]


def test_rally_bench_dryrun_refuses_bad_arguments_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "dryrun", "--runs", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --nodes must be at least 4")
