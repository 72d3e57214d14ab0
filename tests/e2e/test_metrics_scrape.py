"""End to end: every service of a real local cluster serves Prometheus metrics, and they move.

One cluster (3 agents x 4 GPUs in 2 racks): every URL `rally up` lists under ``metrics_urls`` answers
with parseable exposition text; exactly one scheduler leads, by its gauge and its /healthz; no service
exports a ``_created`` sample, each node status has its series at zero too, and nodes and GPUs are counted
under one name each, by the schedulers; a scheduler cycle moves the cycle, admission and GPU gauges; a
preemption moves the preemption counters and the lost GPU-seconds; a hung node's gang recovery moves the
interruption and recovery counters and shows the node's GPUs unhealthy.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import cluster_jobs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("metrics"), nodes=3, gpus_per_node=4, racks=2)
    with local:
        yield local


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return str(response.read().decode())


def scrape(url: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(scrape_text(url)):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    )


SCHEDULERS = ("scheduler-1", "scheduler-2")


def schedulers(cluster: LocalCluster) -> Samples:
    """Both schedulers' samples summed (the leader counts its cycles; either may lead)."""
    merged: Samples = {}
    for name in SCHEDULERS:
        for key, value in scrape(cluster.metrics_urls()[name]).items():
            merged[key] = merged.get(key, 0.0) + value
    return merged


def leader(cluster: LocalCluster) -> Samples:
    """The fold gauges of one scheduler (both fold the same log; either will do)."""
    return scrape(cluster.metrics_urls()["scheduler-1"])


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


submit = partial(cluster_jobs.submit, team="obs", gpus=4, gpus_per_task=4)
job = cluster_jobs.job


def wait_state(cluster: LocalCluster, job_id: str, states: set[str], timeout: float = 30.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(job(cluster, job_id))
        return found["state"] in states

    eventually(reached, f"job {job_id} in {states}", timeout)
    return found


def test_every_service_listed_in_cluster_json_serves_metrics(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.write_info(tmp_path / "cluster.json")
    urls = json.loads((tmp_path / "cluster.json").read_text())["metrics_urls"]
    expected = {"api", "scheduler-1", "scheduler-2", "health-monitor", "preemption", "job-controller"}
    expected |= {f"agent-{node}" for node in cluster.node_ids()}
    assert expected <= set(urls), sorted(urls)
    for name, url in urls.items():
        # The cluster is ready once the API answers and every agent registered; a service still starting
        # on a busy machine opens its port a moment later.
        eventually(lambda url=url: answers(url), f"{name} to serve /metrics")
        samples = scrape(url)
        assert samples, name
        if name != "api" and not name.startswith("agent-"):
            assert total(samples, "rally_log_connected") == 1, name
    eventually(lambda: total(scrape(urls["health-monitor"]), "rally_heartbeats_received_total") > 3, "beats")
    gpus = leader(cluster)
    assert total(gpus, "rally_gpus") == 12
    racks = {dict(labels)["rack"] for name, labels in gpus if name == "rally_gpus"}
    assert len(racks) == 2
    assert total(scrape(urls["scheduler-1"]), "rally_log_lag_events") >= 0


def leading(cluster: LocalCluster) -> dict[str, tuple[float, Any]]:
    """Per scheduler: its rally_leader gauge and its /healthz `leader`."""
    urls = cluster.metrics_urls()
    return {
        name: (
            total(scrape(urls[name]), "rally_leader", role="scheduler"),
            cluster.health(name, "/healthz")[1],
        )
        for name in SCHEDULERS
    }


def one_leader(found: dict[str, tuple[float, Any]]) -> bool:
    """Exactly one scheduler leads, and its gauge and its /healthz agree with each other's."""
    gauges = sorted(gauge for gauge, _ in found.values())
    return gauges == [0.0, 1.0] and all(body.get("leader") is (gauge == 1) for gauge, body in found.values())


def test_one_leader_no_created_samples_zero_series_and_one_name_per_quantity(cluster: LocalCluster) -> None:
    urls = cluster.metrics_urls()
    eventually(lambda: one_leader(leading(cluster)), "one leading scheduler, by its gauge and its /healthz")
    # the projector elects its writer too (one replica here: it leads), by its gauge and its /healthz
    eventually(
        lambda: (
            cluster.health("projector", "/healthz")[1].get("leader") is True
            and total(scrape(urls["projector"]), "rally_leader", role="projector") == 1
        ),
        "the projector leading, by its gauge and its /healthz",
    )
    # a service that elects no leader says null (the API: no field), and exports no leader gauge
    for name in sorted(set(cluster.health_ports) - {*SCHEDULERS, "projector"}):
        assert cluster.health(name, "/healthz")[1].get("leader") is None, name
        assert total(scrape(urls[name]), "rally_leader") == 0, name

    for name, url in urls.items():
        text = scrape_text(url)
        assert "_created" not in text, (name, [line for line in text.splitlines() if "_created" in line][:3])
        families = {sample for sample, _ in scrape(url)}
        # one name per quantity: nodes and GPUs by status come from the schedulers' fold only
        old_names = {"rally_gpus_total", "rally_gpus_free", "rally_gpus_schedulable", "rally_nodes_by_rack"}
        assert not families & old_names, (name, families & old_names)
        if name not in SCHEDULERS:
            assert not families & {"rally_nodes", "rally_gpus"}, name

    # zero series: no node is lost or drained, yet each status has its series on every rack, at 0
    fold = leader(cluster)
    racks = {dict(labels)["rack"] for sample, labels in fold if sample == "rally_nodes"}
    assert len(racks) == 2
    for rack in racks:
        for status in ("up", "unreachable", "drained", "lost"):
            assert ("rally_nodes", (("rack", rack), ("status", status))) in fold, (rack, status)
        assert fold[("rally_nodes", (("rack", rack), ("status", "lost")))] == 0
    assert total(fold, "rally_nodes", status="up") == 3


def test_each_service_paces_its_reads_as_documented(cluster: LocalCluster) -> None:
    """docs/deployment.md, "Read pacing": the services off a job's way to running pace their connection's
    reads, the leading scheduler does not while its standby does; the job controller, the agents and the
    services with fenced partitions never."""

    def pacing(name: str) -> Any:
        return cluster.health(name, "/healthz")[1].get("log", {}).get("read_pacing_s")

    eventually(lambda: one_leader(leading(cluster)), "one leading scheduler")
    eventually(
        lambda: sorted(pacing(name) for name in SCHEDULERS) == [0.0, 0.02],
        "the leader reading at once, the standby paced",
    )
    for name in ("preemption", "inventory", "predictor", "projector"):
        assert pacing(name) == 0.02, name
    unpaced = ("job-controller", "checkpoint", "health-monitor")
    for name in sorted(cluster.health_ports):
        if name in unpaced or name.startswith("agent-"):
            assert pacing(name) == 0.0, name


def test_a_cycle_a_preemption_and_a_recovery_move_their_metrics(cluster: LocalCluster) -> None:
    before = schedulers(cluster)
    # a cycle: one bind, its wait observed, 4 GPUs allocated to team obs
    first = submit(cluster, "filler-0", ["sleep", "300"], priority="best-effort")
    wait_state(cluster, first, {"running"})
    after = schedulers(cluster)
    assert total(after, "rally_scheduler_cycles_total") > total(before, "rally_scheduler_cycles_total")
    assert total(after, "rally_scheduler_cycle_duration_seconds_count") > total(
        before, "rally_scheduler_cycle_duration_seconds_count"
    )
    assert total(after, "rally_admitted_workloads_total", team="obs") == 1
    assert total(after, "rally_admission_wait_time_seconds_count", team="obs") == 1
    eventually(lambda: total(leader(cluster), "rally_team_gpus_allocated", team="obs") == 4, "usage")
    assert total(leader(cluster), "rally_gpus", state="allocated") == 4

    # a preemption: the cluster full of best-effort work, a production job takes one node
    fillers = [
        first,
        *(submit(cluster, f"filler-{i}", ["sleep", "300"], priority="best-effort") for i in (1, 2)),
    ]
    for filler in fillers:
        wait_state(cluster, filler, {"running"})
    assert total(leader(cluster), "rally_gpus", state="free") == 0
    urgent = submit(cluster, "urgent", ["sleep", "1"], priority="production")
    wait_state(cluster, urgent, {"running", "completed"})
    eventually(lambda: total(leader(cluster), "rally_job_preemptions_total", team="obs") >= 1, "preempted")
    assert total(leader(cluster), "rally_lost_gpu_seconds_total", team="obs") > 0
    assert total(leader(cluster), "rally_team_allocated_gpu_seconds_total", team="obs") > 0

    # a recovery: cancel the fillers, run a gang, hang its node: it is repaired on a free node
    for filler in fillers:
        call("DELETE", f"{cluster.api_url}/v1/jobs/{filler}")
    wait_state(cluster, urgent, {"completed"})
    for filler in fillers:
        wait_state(cluster, filler, {"cancelled"})
    gang = submit(cluster, "gang", ["sleep", "300"], gpus=8)  # two nodes: one is kept, one replaced
    hung = wait_state(cluster, gang, {"running"})["nodes"][1]
    recoveries = total(schedulers(cluster), "rally_gang_recoveries_total")
    cluster.freeze_node(hung, signal.SIGSTOP)
    try:
        eventually(
            lambda: total(leader(cluster), "rally_job_interruptions_total", team="obs") >= 1, "interruption"
        )
        assert total(leader(cluster), "rally_gpus", state="unhealthy") == 4
        assert total(leader(cluster), "rally_nodes", status="up") == 2
        eventually(
            lambda: (
                total(schedulers(cluster), "rally_gang_recoveries_total", outcome="repaired") > recoveries
            ),
            "repair",
        )
        assert hung not in wait_state(cluster, gang, {"running"})["nodes"]
    finally:
        cluster.freeze_node(hung, signal.SIGCONT)
    call("DELETE", f"{cluster.api_url}/v1/jobs/{gang}")
