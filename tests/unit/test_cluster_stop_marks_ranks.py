"""Stopping the local cluster (Ctrl-C on `rally up`) records the ranks it stops as stopped by the cluster
(Issue 18: they failed with `code -1` or their kill signal, as if the program had failed)."""

from __future__ import annotations

from pathlib import Path

from rallypoint.agent import workdir
from rallypoint.localcluster import LocalCluster


def test_running_ranks_get_the_clusters_exit_record_and_finished_ones_keep_theirs(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=1, gpus_per_node=1, racks=1)
    attempt = tmp_path / "agents" / "node-1" / "j-1" / "1"
    attempt.mkdir(parents=True)
    for rank in (0, 1):
        workdir.write_atomic(workdir.rank_file(attempt, rank, "pid"), {"pid": 0, "wrapper_pid": 0})
    workdir.write_atomic(workdir.rank_file(attempt, 1, "exit"), {"exit_code": 0, "at": 1.0})
    cluster.stop()  # nothing started: it only marks what runs
    assert (
        workdir.read_record(workdir.rank_file(attempt, 0, "exit"))["exit_code"]
        == workdir.EXIT_CLUSTER_STOPPED
    )
    assert workdir.read_record(workdir.rank_file(attempt, 1, "exit"))["exit_code"] == 0
    # the wrapper of rank 0, seeing its rank killed, cannot replace the record
    assert not workdir.write_atomic(workdir.rank_file(attempt, 0, "exit"), {"exit_code": 137}, exclusive=True)
