"""End to end: two job controllers share the jobs on a local cluster (``replicas={"job-controller": 2}``,
``rally up --replicas job-controller=2``); one is killed with kill -9 under a trickle of jobs. Every job
completes once: none is lost (the survivor takes the dead one's partitions within seconds) and none is
started, run or ended twice for one attempt.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_jobs import assert_each_ran_once, log_records, submit, wait_for

from rallypoint.events import LeaderEpochStarted, subjects
from rallypoint.localcluster import LocalCluster

pytestmark = pytest.mark.slow

CONTROLLERS = ("job-controller-1", "job-controller-2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("controllers"),
        nodes=2,
        gpus_per_node=4,
        racks=1,
        with_projector=False,
        replicas={"job-controller": 2},
    )
    with local:
        yield local


def test_a_killed_job_controller_loses_no_job_and_none_runs_twice(cluster: LocalCluster) -> None:
    assert set(CONTROLLERS) <= set(cluster.processes)
    jobs: list[str] = []
    for i in range(12):
        jobs.append(submit(cluster, f"trickle-{i}", ["sleep", "0.5"]))
        if i == 5:
            cluster.kill("job-controller-1", signal.SIGKILL)
        time.sleep(0.3)
    for job_id in jobs:
        wait_for(cluster, job_id, lambda v: v["state"] == "completed", "completed", timeout=60.0)
    assert cluster.dead_services() == ["job-controller-1"]
    with urllib.request.urlopen(cluster.metrics_urls()["job-controller-2"], timeout=10) as answer:
        metrics = answer.read().decode()
    owned = [line for line in metrics.splitlines() if line.startswith("rally_partitions_owned{")]
    assert len(owned) == 1 and float(owned[0].split()[-1]) == subjects.CONTROL_PARTITIONS, owned

    records = [event for _, event in log_records(cluster, "e2e-controllers")]
    assert_each_ran_once(records, jobs)
    owners = {
        e.leader_id
        for e in records
        if isinstance(e, LeaderEpochStarted) and e.role.startswith(f"{subjects.CONTROL_ROLE}.")
    }
    assert owners == set(CONTROLLERS), owners  # both owned partitions; the survivor took the dead one's
