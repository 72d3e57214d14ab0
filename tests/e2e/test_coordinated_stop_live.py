"""End to end: a preempted 4-rank gang of examples/train_numpy.py (2 nodes x 2 ranks) agrees on one stop
step, commits it within the grace and loses no work beyond it (a real local cluster, 2 agents x 8 GPUs).

Before the agreement, ranks SIGTERMed a moment apart saved different steps, nothing committed, and the
gang held its 16 GPUs until the SIGKILL at the end of the 30 s grace (issue 31).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cluster_jobs
import pytest

from rallypoint.events import CheckpointCommitted, Event, JobPreempted, PreemptionRequested, RankExited
from rallypoint.localcluster import LocalCluster

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"
GPUS, RANKS = 16, 4
GRACE_S = 30.0  # the job controller's default --preemption-grace


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("stop"), nodes=2, gpus_per_node=8, racks=1)
    with local:
        yield local


def events_of(cluster: LocalCluster, job_id: str) -> list[Event]:
    records = cluster_jobs.log_records(cluster, "e2e-stop")
    return [event for _, event in records if getattr(event, "job_id", None) == job_id]


def wait_for_event(cluster: LocalCluster, job_id: str, kind: type, timeout: float = 120.0) -> list[Event]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = events_of(cluster, job_id)
        if any(isinstance(event, kind) for event in events):
            return events
        time.sleep(0.5)
    raise AssertionError(f"no {kind.__name__} for {job_id} within {timeout}s")


def test_a_preempted_gang_commits_one_stop_step_and_loses_no_work(cluster: LocalCluster) -> None:
    # Short steps: signals a few milliseconds apart land on different steps of different ranks.
    command = [
        sys.executable,
        str(EXAMPLE),
        "--steps",
        "1000000",
        "--step-time",
        "0.005",
        "--ckpt-every",
        "400",
    ]
    victim = cluster_jobs.submit(
        cluster, "victim", command, gpus=GPUS, gpus_per_task=8, ranks_per_task=2, priority="best-effort"
    )
    wait_for_event(cluster, victim, CheckpointCommitted)  # the gang trains (and checkpoints)
    urgent = cluster_jobs.submit(cluster, "urgent", ["sh", "-c", "sleep 1"], gpus=8, priority="production")

    mine = wait_for_event(cluster, victim, JobPreempted)
    [asked] = [e for e in mine if isinstance(e, PreemptionRequested) and e.for_job == urgent]
    [preempted] = [e for e in mine if isinstance(e, JobPreempted)]
    exits = [e for e in mine if isinstance(e, RankExited) and e.attempt == 1]
    commits = [e for e in mine if isinstance(e, CheckpointCommitted) and e.attempt == 1]
    assert sorted(e.rank for e in exits) == list(range(RANKS))
    assert [e.exit_code for e in exits] == [0] * RANKS, exits
    [stop] = [e for e in commits if e.at >= asked.at]  # one checkpoint of the whole gang, in the grace
    assert preempted.checkpoint_step == stop.step
    stopped_after_s = max(e.at for e in exits) - asked.at
    assert stopped_after_s < GRACE_S / 3, f"the gang stopped {stopped_after_s:.1f}s after the request"
    assert preempted.lost_gpu_s < GPUS * 2.0, f"{preempted.lost_gpu_s:.1f} GPU-seconds lost"
    print(
        f"stop step {stop.step}; ranks exited 0 {stopped_after_s:.2f}s after the preemption request; "
        f"{preempted.lost_gpu_s:.2f} GPU-seconds lost"
    )
