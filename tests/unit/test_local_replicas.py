"""`rally up --replicas` / `--nats-servers` (issue 34): what the flags accept, and the instance names the
local cluster gives each replica (tools, tests and the chaos run find them by these names)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rallypoint.cli.cluster_cmds import _replicas
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.supervisor import REPLICATED, SINGLETONS, instances


def test_every_service_but_the_agent_may_have_replicas() -> None:
    assert {"api", "scheduler", *SINGLETONS} == REPLICATED
    assert _replicas("api=2,scheduler=3,projector=2") == {"api": 2, "scheduler": 3, "projector": 2}
    for bad in ("agent=2", "job-controller=0", "job-controller", "job-controller=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="SERVICE=N"):
            _replicas(bad)


def test_instance_names() -> None:
    assert instances("job-controller", 1) == ("job-controller",)
    assert instances("job-controller", 2) == ("job-controller-1", "job-controller-2")
    assert instances("api", 3) == ("api", "api-2", "api-3")  # the first keeps --api-port and its name
    assert instances("scheduler", 2) == ("scheduler-1", "scheduler-2")


def test_a_nats_cluster_needs_a_quorum_and_our_own_servers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="odd"):
        LocalCluster(tmp_path, nats_servers=2)
    with pytest.raises(ValueError, match="nats_url"):
        LocalCluster(tmp_path, nats_servers=3, nats_url="nats://127.0.0.1:4222")
    with pytest.raises(ValueError, match="at least 1"):
        LocalCluster(tmp_path, replicas={"agent": 2})
    cluster = LocalCluster(tmp_path, replicas={"api": 2})
    assert cluster.replicas == {"scheduler": 2, "api": 2}  # a leader and a standby unless told otherwise
