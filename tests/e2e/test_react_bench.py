"""End to end: ``python -m rallypoint.bench.reactbench`` at a tiny size drives every job through its
whole life and reports each service's CPU per job, PostgreSQL's included."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_react_bench_drives_every_job_to_completion_and_reports_cpu_per_job() -> None:
    argv = [
        sys.executable, "-m", "rallypoint.bench.reactbench", "--nodes", "16", "--jobs", "40",
        "--rate", "100", "--run-s", "1", "--rounds", "1", "--idle-s", "1", "--fleets", "1", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    (round_,) = res["rounds"]
    assert round_["jobs"] == round_["completed"] == 40
    assert round_["all_completed"] and round_["projected"]
    spent = round_["cpu_ms_per_job"]
    assert all(spent.get(name, 0) > 0 for name in ("job-controller", "projector", "nats-server"))
    assert "postgres" in res["idle_cpu_ms_per_s"]
    assert set(round_["net_cpu_ms_per_job"]) <= set(spent) | {"postgres"}
