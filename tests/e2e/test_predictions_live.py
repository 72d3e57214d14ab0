"""End to end: waiting jobs carry predicted starts, and the predicted P50 is checked against the real start.

A 2-node local cluster (8 GPUs each) learns a job name's runtime from two runs of it, then runs a scripted
workload: two 8-GPU jobs fill the cluster, two more wait. The predictor service runs the live fold
forward under the scheduler's own policy with the learned runtimes, so each waiting job must be predicted
to start when the job ahead of it ends; the jobs then run, and each predicted P50 must lie within
``TOLERANCE_S`` of the job's actual start (the gap is the cluster's own reaction: a completion noticed,
a cycle, a launch). `rally jobs` shows the START column, `rally show` the PredictedStart line, `rally why` its
line, a dry run of one more job its own predicted start, and the predictor's /metrics scores what happened.
"""

from __future__ import annotations

import io
import time
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import cluster_jobs
import pytest

from rallypoint.cli.main import main
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

RUN_S = 12  # each scripted job's runtime
# A waiting job starts after the job ahead of it ends, the job controller reports it, the scheduler binds
# and an agent launches: seconds on a loaded 2-core machine, never the runtime itself.
TOLERANCE_S = 8.0
TERMINAL = {"completed", "failed", "cancelled", "rejected"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("predict"), nodes=2, gpus_per_node=8, racks=1) as local:
        yield local


def submit(cluster: LocalCluster, name: str) -> str:
    return cluster_jobs.submit(cluster, name, ["sleep", str(RUN_S)], gpus=8, gpus_per_task=8)


def wait_until(check: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.2)


def view(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster_jobs.job(cluster, job_id)


def settled(cluster: LocalCluster, job_id: str) -> dict[str, Any] | None:
    found = view(cluster, job_id)
    return found if found["state"] in TERMINAL else None


def predicted(cluster: LocalCluster, job_id: str) -> dict[str, Any] | None:
    """The job's predicted start once a refresh that saw it (and the runs it learns from) has one."""
    start = view(cluster, job_id)["predicted_start"]
    if start is None or start["status"] != "predicted" or start["runtime_from"] == "none":
        return None
    return dict(start)


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def rally(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    monkeypatch.setenv("RALLY_API_URL", cluster.api_url)
    monkeypatch.setenv("RALLY_TOKEN", cluster.admin_token)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_waiting_jobs_are_predicted_to_start_when_the_jobs_ahead_end_and_do(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for teacher in [submit(cluster, "train"), submit(cluster, "train")]:  # two past runs of the name
        assert (
            wait_until(lambda t=teacher: settled(cluster, t), "a teaching run ended")["state"] == "completed"
        )
    running = [submit(cluster, "train"), submit(cluster, "train")]
    for job_id in running:
        wait_until(lambda j=job_id: view(cluster, j)["state"] == "running", f"{job_id} running")
    waiting = [submit(cluster, "train"), submit(cluster, "train")]
    predictions = {
        job_id: wait_until(lambda j=job_id: predicted(cluster, j), f"{job_id} predicted")
        for job_id in waiting
    }
    started = {j: view(cluster, j)["started_at"] for j in running}
    for start in predictions.values():
        assert start["runtime_from"] == "team+name" and start["runtime_p50_s"] >= RUN_S * 0.8, start
        assert start["p90"] >= start["p50"], start
        # each waits for one of the running jobs: it is predicted to start when that one is to end
        ends = sorted(s + start["runtime_p50_s"] for s in started.values())
        assert min(abs(start["p50"] - end) for end in ends) < 1.0, (start, ends)

    # a dry run of one more such job: admitted, waiting, and predicted to start no earlier than those ahead
    body = {"name": "train", "team": "e2e", "gpus": 8, "gpus_per_task": 8, "command": ["sleep", "1"]}
    status, dry = call("POST", f"{cluster.api_url}/v1/jobs?dry_run=true", body)
    assert status == 200 and dry["would_admit"] and dry["placement"] is None, dry
    assert dry["predicted_start"]["status"] == "predicted", dry
    assert dry["predicted_start"]["p50"] >= max(p["p50"] for p in predictions.values()) - 1.0, dry

    assert "Predicted start: in " in rally(cluster, monkeypatch, "why", waiting[0])
    table = rally(cluster, monkeypatch, "jobs", "--state", "pending")
    assert "START" in table.splitlines()[0]
    assert any(line.startswith(waiting[0]) and " in " in line for line in table.splitlines()), table
    assert "PredictedStart=" in rally(cluster, monkeypatch, "show", waiting[0])

    for job_id, start in predictions.items():
        ended = wait_until(lambda j=job_id: settled(cluster, j), f"{job_id} ended", timeout=180)
        assert ended["state"] == "completed", ended
        error = abs(ended["started_at"] - start["p50"])
        assert error <= TOLERANCE_S, f"{job_id} started {error:.1f} s from its predicted P50 ({start})"

    scored = 'rally_prediction_accuracy{measure="within_1min"}'
    wait_until(lambda: scored in metrics_text(cluster.metrics_urls()["predictor"]), "the starts scored")
    # no dry run was asked: none answered from a forecast
    exported = metrics_text(cluster.metrics_urls()["predictor"])
    assert "rally_prediction_dry_runs_estimated_total 0.0" in exported
    summary = rally(cluster, monkeypatch, "predictions")
    assert "under rallypoint" in summary and "start within 1 min of its P50" in summary, summary
