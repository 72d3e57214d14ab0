"""End to end: two health monitors share the nodes on a local cluster (``replicas={"health-monitor": 2}``,
``rally up --replicas health-monitor=2``). The monitor owning a node's partition is killed with kill -9,
then that node's agent: the survivor takes the dead monitor's partitions within seconds and declares the
node lost, once, and the dead monitor writes nothing after its death.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_jobs import log_records

from rallypoint.events import LeaderEpochStarted, NodeLost, subjects
from rallypoint.localcluster import LocalCluster
from rallypoint.runtime.partitions import rendezvous

pytestmark = pytest.mark.slow

MONITORS = ("health-monitor-1", "health-monitor-2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("monitors"),
        nodes=3,
        gpus_per_node=1,
        racks=1,
        with_projector=False,
        replicas={"health-monitor": 2},
        service_args={"health-monitor": ["--unreachable-after", "2", "--lost-after", "4"]},
    )
    with local:
        yield local


def _owned(cluster: LocalCluster, monitor: str) -> float:
    with urllib.request.urlopen(cluster.metrics_urls()[monitor], timeout=10) as answer:
        metrics = answer.read().decode()
    owned = [line for line in metrics.splitlines() if line.startswith("rally_partitions_owned{")]
    return float(owned[0].split()[-1]) if owned else 0.0


def _until(check: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_monitors_node_is_still_declared_lost(cluster: LocalCluster) -> None:
    assert set(MONITORS) <= set(cluster.processes)
    _until(
        lambda: sum(_owned(cluster, m) for m in MONITORS) == subjects.HEALTH_PARTITIONS,
        "the two monitors to own every partition",
        90.0,  # the cluster's start on a loaded 2-core machine (30 s was once not enough in the full suite)
    )
    node = cluster.agent_nodes()[0]
    owner = rendezvous(subjects.partition_of(node, subjects.HEALTH_PARTITIONS), MONITORS)
    assert owner is not None
    survivor = next(m for m in MONITORS if m != owner)
    killed_from = max(seq for seq, _ in log_records(cluster, "e2e-monitors-before"))
    cluster.kill(owner, signal.SIGKILL)
    cluster.kill(f"agent-{node}", signal.SIGKILL)
    _until(
        lambda: _owned(cluster, survivor) == subjects.HEALTH_PARTITIONS,
        "the survivor to own every partition",
        15.0,
    )

    def lost() -> list[NodeLost]:
        return [
            e
            for _, e in log_records(cluster, "e2e-monitors")
            if isinstance(e, NodeLost) and e.node_id == node
        ]

    _until(lambda: bool(lost()), f"{node} declared lost", 30.0)
    records = log_records(cluster, "e2e-monitors-after")
    assert sum(isinstance(e, NodeLost) and e.node_id == node for _, e in records) == 1
    late_epochs = [
        e
        for seq, e in records
        if seq > killed_from and isinstance(e, LeaderEpochStarted) and e.leader_id == owner
    ]
    assert late_epochs == []
    survivors = {
        e.role
        for seq, e in records
        if seq > killed_from and isinstance(e, LeaderEpochStarted) and e.leader_id == survivor
    }
    assert survivors, "the survivor fenced the dead monitor's partitions"
    assert all(role.startswith(f"{subjects.HEALTH_ROLE}.") for role in survivors)
