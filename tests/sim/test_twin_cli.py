"""``rally sim twin``: the twin comparison (sim/twin.py) on files, through the console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rallypoint.cli.main import main


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    jobs = [
        {"id": "a", "submit": 0, "gpus": 16, "duration": 400, "team": "t2", "priority": "best-effort"},
        {"id": "b", "submit": 5, "gpus": 8, "duration": 100, "team": "t1", "time_limit": 200},
        {"id": "c", "submit": 10, "gpus": 16, "duration": 50, "team": "t1", "priority": "training-high"},
        {"id": "d", "submit": 20, "gpus": 8, "duration": 90, "team": "t2", "min_gpus": 4, "max_gpus": 16,
         "gpu_step": 4, "gpus_per_task": 4},
        {"id": "e", "submit": 30, "gpus": 64, "duration": 10, "team": "t1"},
    ]  # fmt: skip
    paths = {"workload": tmp_path / "w.jsonl", "cluster": tmp_path / "c.yaml", "queues": tmp_path / "q.yaml"}
    paths["workload"].write_text("".join(json.dumps(j) + "\n" for j in jobs))
    paths["cluster"].write_text("generator: {racks: 2, nodes_per_rack: 2, gpus_per_node: 8}\n")
    paths["queues"].write_text(
        "cohorts: [{name: all}]\n"
        "teams:\n"
        "  - {name: t1, nominal: 16, cohort: all, borrowing_limit: 8}\n"
        "  - {name: t2, nominal: 16, cohort: all}\n"
    )
    return paths


def twin(files: dict[str, Path], *extra: str) -> int:
    args = ["sim", "twin", "--workload", str(files["workload"]), "--cluster", str(files["cluster"])]
    return main([*args, "--queues", str(files["queues"]), *extra])


def test_twin_says_each_policy_decides_identically_and_writes_its_reports(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "twin.json"
    assert twin(files, "--policy", "fifo,las,rallypoint", "--json", str(out)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["fifo", "las", "rallypoint"]
    assert all(line.endswith(": identical") for line in lines)
    reports = json.loads(out.read_text())
    assert set(reports) == {"fifo", "las", "rallypoint"}
    assert all(r["mismatches"] == [] and r["cycles"] > 0 for r in reports.values())
    assert reports["rallypoint"]["rejected_live"] == ["e"]  # 64 GPUs on a 32-GPU cluster


def test_twin_refuses_a_time_limit_a_live_job_cannot_have(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    files["workload"].write_text(
        json.dumps({"id": "x", "submit": 0, "gpus": 1, "duration": 5, "team": "t1", "time_limit": 9.5}) + "\n"
    )
    assert twin(files, "--policy", "fifo") == 2
    assert "whole seconds" in capsys.readouterr().err
