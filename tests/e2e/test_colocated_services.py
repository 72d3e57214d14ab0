"""End to end: the job controller, checkpoint, preemption and inventory services and the predictor hosted
together (``rally up --colocate ... --replicas ...=2``: two host processes, each one replica of each over
one fold). Each hosted service still answers its own health port, connects as its own NATS user (a write
on another's subjects would be refused and logged) and owns its own partitions; a host killed with
kill -9 under a trickle of jobs loses no job, and none runs twice; the predictors learn every ended job
from the shared fold, the restarted one too (its fold restored from the job controller's snapshot)."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_jobs import assert_each_ran_once, log_records, submit, wait_for

from rallypoint.events import subjects
from rallypoint.localcluster import LocalCluster

pytestmark = pytest.mark.slow

COLOCATED = ("job-controller", "checkpoint", "preemption", "inventory", "predictor")
HOSTS = ("host-1", "host-2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("colocated"),
        nodes=2,
        gpus_per_node=4,
        racks=1,
        with_projector=False,
        replicas=dict.fromkeys(COLOCATED, 2),
        colocate=COLOCATED,
    )
    with local:
        yield local


def _metric(cluster: LocalCluster, instance: str, prefix: str) -> float:
    """The sum of an instance's samples whose line starts with ``prefix``."""
    with urllib.request.urlopen(cluster.metrics_urls()[instance], timeout=10) as answer:
        metrics = answer.read().decode()
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))


def _owned(cluster: LocalCluster, instance: str) -> float:
    return _metric(cluster, instance, "rally_partitions_owned{")


def _learned(cluster: LocalCluster, instance: str) -> float:
    """Ended jobs a predictor learned runtimes from (it learns on its refresh, every 5 s by default)."""
    return _metric(cluster, instance, "rally_prediction_learned_jobs ")


def _wait_learned(cluster: LocalCluster, instance: str, count: int) -> None:
    deadline = time.monotonic() + 60.0
    while _learned(cluster, instance) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _learned(cluster, instance) >= count, instance


def test_each_hosted_service_answers_for_itself(cluster: LocalCluster) -> None:
    assert set(HOSTS) <= set(cluster.processes)
    assert not set(cluster.processes) & {f"{service}-1" for service in COLOCATED}  # no process of their own
    for service in COLOCATED:
        for instance in (f"{service}-1", f"{service}-2"):
            assert cluster.hosted[instance] in HOSTS
            status, body = cluster.health(instance, "/healthz")
            assert status == 200 and body["status"] == "ok", (instance, body)
            assert body["log"]["fold_seq"] > 0, body
    # Each service wrote as its own user: nothing in the hosts' logs was refused by the permissions.
    for host in HOSTS:
        text = (cluster.workdir / "logs" / f"{host}.log").read_text()
        assert "permissions violation" not in text


def test_a_killed_host_loses_no_job_and_none_runs_twice(cluster: LocalCluster) -> None:
    jobs: list[str] = []
    for i in range(12):
        jobs.append(submit(cluster, f"hosted-{i}", ["sleep", "0.5"]))
        if i == 5:
            cluster.kill("job-controller-1", signal.SIGKILL)  # its host: all four services of replica 1
        time.sleep(0.3)
    for job_id in jobs:
        wait_for(cluster, job_id, lambda v: v["state"] == "completed", "completed", timeout=60.0)
    assert cluster.dead_services() == ["host-1"]
    deadline = time.monotonic() + 30.0
    while _owned(cluster, "job-controller-2") != subjects.CONTROL_PARTITIONS and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _owned(cluster, "job-controller-2") == subjects.CONTROL_PARTITIONS
    assert _owned(cluster, "checkpoint-2") == subjects.CHECKPOINT_PARTITIONS

    records = [event for _, event in log_records(cluster, "e2e-colocated")]
    assert_each_ran_once(records, jobs)
    _wait_learned(cluster, "predictor-2", len(jobs))

    cluster.supervise()  # the host comes back with all four of its services
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if all(cluster.health(f"{service}-1", "/healthz")[0] == 200 for service in COLOCATED):
            break
        time.sleep(0.5)
    for service in COLOCATED:
        status, body = cluster.health(f"{service}-1", "/healthz")
        assert status == 200, (service, body)
    _wait_learned(cluster, "predictor-1", len(jobs))
