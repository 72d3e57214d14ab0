"""`rally up --colocate` / `rally serve host`: which services may share a process, refused clearly
before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rallypoint.cli.serve import colocated_services, host_groups, run
from rallypoint.localcluster import LocalCluster


def test_host_groups_split_each_service_with_its_own_arguments() -> None:
    groups = host_groups(["job-controller", "--instance", "a", "::", "checkpoint", "--keep", "3"])
    assert groups == [["job-controller", "--instance", "a"], ["checkpoint", "--keep", "3"]]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["api", "::", "checkpoint"], "'api'"),  # the API keeps its own process
        (["checkpoint", "::", "checkpoint"], "each service once"),
        (["checkpoint", "::"], "'nothing'"),
        (["checkpoint", "--keep", "3"], "two services or more"),
    ],
)
def test_host_refuses_what_it_cannot_host(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        host_groups(argv)


def test_serve_host_says_why_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["host", "scheduler", "::", "checkpoint"]) == 2
    assert "cannot host 'scheduler'" in capsys.readouterr().err
    assert run(["host", "--help"]) == 0
    assert "usage: rally serve host" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["checkpoint", "checkpoint,api", "checkpoint,checkpoint", ""])
def test_colocate_flag_needs_two_distinct_hostable_services(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="two or more of"):
        colocated_services(text)
    assert colocated_services("job-controller, inventory") == ("job-controller", "inventory")
    assert colocated_services("predictor,checkpoint") == ("predictor", "checkpoint")


def test_colocated_services_run_as_many_replicas_each(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="as many replicas each"):
        LocalCluster(tmp_path, colocate=("job-controller", "checkpoint"), replicas={"job-controller": 2})
    cluster = LocalCluster(tmp_path, colocate=("job-controller", "checkpoint"), replicas={"checkpoint": 1})
    assert cluster.colocate == ("job-controller", "checkpoint")
