"""The canonical workload, cluster and queue formats: parsing and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.scheduling.queues import QueuesError, load_queues, queues_from_obj
from rallypoint.sim.cluster import ClusterError, cluster_from_obj, load_cluster
from rallypoint.sim.workload import Job, WorkloadError, load_workload, parse_lines, write_workload


def test_workload_roundtrip_keeps_file_order_for_ties(tmp_path: Path) -> None:
    jobs = [
        Job(id="b", submit=5, gpus=2, duration=10, team="t"),
        Job(id="a", submit=5, gpus=1, duration=3, team="t"),
        Job(id="c", submit=1, gpus=16, duration=7, team="u", gpus_per_task=8, priority="x"),
    ]
    p = tmp_path / "w.jsonl"
    write_workload(p, jobs)
    back = load_workload(p)
    assert [j.id for j in back] == ["c", "b", "a"]
    assert back[0] == jobs[2]
    assert back[1].task_gpus == 2 and back[0].task_gpus == 8


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"id": "a", "submit": 0, "gpus": 1, "team": "t"}', "duration"),
        ('{"id": "a", "submit": 0, "gpus": 0, "duration": 1, "team": "t"}', "gpus must be >= 1"),
        ('{"id": "a", "submit": 0, "gpus": 12, "duration": 1, "team": "t"}', "multiple of gpus_per_task"),
        ('{"id": "a", "submit": -1, "gpus": 1, "duration": 1, "team": "t"}', "submit"),
        ('{"id": "a", "submit": 0, "gpus": 1, "duration": 1, "team": "t", "bogus": 1}', "bogus"),
        ("not json", "malformed"),
        ('{"id": "a", "submit": 0, "gpus": 4, "duration": 1, "team": "t", "min_gpus": 8}', "min_gpus"),
    ],
)
def test_workload_errors_name_the_line(line: str, needle: str) -> None:
    with pytest.raises(WorkloadError) as e:
        parse_lines(["", line], "w.jsonl")
    assert "w.jsonl:2:" in str(e.value)
    assert needle.lower() in str(e.value).lower()


def test_workload_duplicate_and_missing(tmp_path: Path) -> None:
    line = '{"id": "a", "submit": 0, "gpus": 1, "duration": 1, "team": "t"}'
    with pytest.raises(WorkloadError, match="duplicate"):
        parse_lines([line, line])
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "nope.jsonl")


def test_cluster_generator_and_nodes(tmp_path: Path) -> None:
    c = cluster_from_obj(
        {
            "generator": [{"racks": 2, "nodes_per_rack": 4, "gpu_type": "H100"}],
            "nodes": [{"id": "x", "rack": "rx", "gpus": 2, "gpu_type": "T4"}],
            "faults": {"node_mtbf": 1e6, "repair_time": 60},
        }
    )
    assert c.total_gpus == 2 * 4 * 8 + 2
    assert c.gpu_types == ("H100", "T4")
    assert c.faults.node_mtbf == 1e6
    p = tmp_path / "c.yaml"
    p.write_text("generator: {racks: 1, nodes_per_rack: 8, gpus_per_node: 8}\n")
    assert load_cluster(p).total_gpus == 64
    with pytest.raises(ClusterError, match="no nodes"):
        cluster_from_obj({})
    with pytest.raises(ClusterError, match="duplicate"):
        cluster_from_obj(
            {"nodes": [{"id": "a", "rack": "r", "gpus": 1}, {"id": "a", "rack": "r", "gpus": 1}]}
        )
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ClusterError, match="not valid"):
        load_cluster(bad)


def test_queues(tmp_path: Path) -> None:
    q = queues_from_obj(
        {"teams": [{"name": "a", "nominal": 8, "cohort": "c", "weight": 2}], "cohorts": [{"name": "c"}]}
    )
    assert q.nominal("a") == 8 and q.nominal("zzz") == 0
    assert q.priority_classes is None
    with pytest.raises(QueuesError, match="cohort"):
        queues_from_obj({"teams": [{"name": "a", "cohort": "nope"}], "cohorts": [{"name": "c"}]})
    with pytest.raises(QueuesError, match="default_priority"):
        queues_from_obj({"priority_classes": [{"name": "hi", "value": 1}]})
    with pytest.raises(QueuesError, match="default_priority 'urgent'"):
        queues_from_obj({"default_priority": "urgent"})  # not one of the built-in classes either
    assert queues_from_obj({"priority_classes": []}).class_values() == {}  # no class at all: allowed
    assert queues_from_obj({"default_priority": "development"}).default_priority == "development"
    p = tmp_path / "q.yaml"
    p.write_text("teams:\n  - {name: a, nominal: 4}\n")
    assert load_queues(p).teams[0].nominal == 4
