"""`rally bench dryrun` runs end to end at a small size (a real nats-server, the real API on a real port)
and its JSON has the figures docs/benchmarks.md quotes (issue 33, Build item 3)."""

from __future__ import annotations

import argparse

import pytest

from rallypoint.bench.dryrunbench import run
from rallypoint.cli.main import main


def test_the_dry_run_bench_times_dry_runs_that_append_nothing() -> None:
    cfg = argparse.Namespace(nodes=200, pending=100, runs=8, seed=1)
    figures = run(cfg, settle=False)  # the test runner's heap is not the bench's to freeze
    assert (figures["nodes"], figures["pending"], figures["dry_runs"]) == (200, 100, 8)
    assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert figures["first_ms"] > 0 and figures["cpu_ms_per_dry_run"] > 0
    assert figures["placed"] + figures["waiting"] + figures["refused"] == 8 and figures["refused"] == 0
    assert figures["appended"] == 0 and figures["log_position"] == figures["events"]
    assert figures["running"] > 0 and "load_1m_before" in figures


def test_rally_bench_dryrun_refuses_bad_arguments_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "dryrun", "--runs", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --nodes must be at least 4")
