"""`rally submit --dry-run`: how the API's answer is printed, and the exit codes (issue 33, Build item 3).

The answers are the API's own (``services/api/dryrun.py``'s ``DryRuns`` judging on a fold of two 8-GPU
nodes, the real core deciding), so the printed lines follow the shape the API really gives; only the HTTP
round trip is left out.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec
import pytest
from rallypoint_services.api.dryrun import DryReason, DryRuns

from rallypoint.cli import jobs_cmds
from rallypoint.cli.client import ApiClient, Response
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.scheduling.queues import Queues, Team
from rallypoint.state import ClusterState

QUEUES = Queues(teams=[Team(name="nlp", nominal=16)])


def two_nodes() -> ClusterState:
    state = ClusterState()
    for i in range(2):
        gpus = tuple(GpuInfo(index=g, uuid=f"g{i}{g}", memory_mib=1, nvlink_domain=0) for g in range(8))
        state.apply(
            i + 1,
            NodeRegistered(
                node_id=f"n{i}", address="10.0.0.1", rack="r0", gpu_type="H100", gpus=gpus,
                cpu_milli=96000, memory_mib=1 << 20, agent_instance="test", at=1.0,
            ),
        )  # fmt: skip
    return state


def fill(state: ClusterState) -> None:
    """Bind a 16-GPU job of another team on both nodes."""
    spec = JobSpec(name="big", team="vision", gpus=16, gpus_per_task=8, ranks_per_task=8, command=("true",))
    state.apply(3, JobSubmitted(job_id="j-big", spec=spec, submitted_at=1.0))
    state.apply(4, LeaderEpochStarted(epoch=1, leader_id="s", at=1.0))
    placements = tuple(TaskPlacement(task=i, node_id=f"n{i}", gpus=tuple(range(8))) for i in range(2))
    bound = GangBound(
        job_id="j-big", attempt=1, epoch=1, placements=placements, computed_at_seq=4,
        policy_version="t", now=2.0, at=2.0,
    )  # fmt: skip
    state.apply(5, bound)


def judged(state: ClusterState, refused: DryReason | None = None, **job_id: str) -> dict[str, Any]:
    spec = JobSpec(
        name="train", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("python", "train.py")
    )
    answer = DryRuns(QUEUES).judge(state, spec, job_id=job_id.get("job_id"), refused=refused, now=10.0)
    return dict(json.loads(msgspec.json.encode(answer)))  # as the API sends it


def run_cli(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], *flags: str) -> int:
    sent: list[dict[str, Any]] = []

    class Api(ApiClient):
        def request(self, method: str, path: str, **kwargs: Any) -> Response:
            sent.append({"method": method, "path": path, **kwargs})
            return Response(200, answer, {})

    monkeypatch.setattr(jobs_cmds, "ApiClient", Api)
    parser = argparse.ArgumentParser(prog="rally")
    jobs_cmds.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["submit", "--dry-run", "--gpus", "8", "--team", "nlp", *flags, "--", "true"])
    code: int = args.func(args)
    [request] = sent
    assert (request["method"], request["path"], request["params"]) == (
        "POST",
        "/v1/jobs",
        {"dry_run": "true"},
    )
    return code


def test_a_placed_job_prints_where_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = judged(two_nodes(), job_id="j-0123456789ab")
    assert run_cli(monkeypatch, answer) == jobs_cmds.EXIT_OK
    assert capsys.readouterr().out.splitlines() == [
        "Would be admitted to queue nlp",
        "Placement: 8 H100 GPUs on n0 (task 0 on n0 GPUs 0,1,2,3,4,5,6,7)",
        "Quota: queue nlp uses 0 of nominal 16 H100 GPUs; room for 16 more",
        "Job id: j-0123456789ab (its Idempotency-Key's)",
        "Log position: 2 (nothing was submitted)",
    ]


def test_a_waiting_job_prints_its_reason_and_what_would_start_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = two_nodes()
    fill(state)
    answer = judged(state)
    assert run_cli(monkeypatch, answer) == jobs_cmds.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Would be admitted to queue nlp"
    assert lines[1].startswith("Would wait: Resources, #1: ") and "0 free" in lines[1]
    assert lines[2] == "To start: 8 more free H100 GPUs (it needs 8; 0 free)"
    assert lines[-1] == "Log position: 5 (nothing was submitted)"


def test_a_refusal_exits_1_and_json_is_the_apis_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refusal = DryReason(
        code="FairUse", message="team 'nlp' submits beyond ...", limit="submissions_per_minute"
    )
    answer = judged(two_nodes(), refused=refusal)
    assert run_cli(monkeypatch, answer) == jobs_cmds.EXIT_WOULD_REFUSE
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Would be refused: FairUse (submissions_per_minute): team 'nlp' submits beyond ..."
    assert run_cli(monkeypatch, answer, "-o", "json") == jobs_cmds.EXIT_WOULD_REFUSE
    assert json.loads(capsys.readouterr().out) == answer
    priority = DryReason(code="PriorityNotAllowed", message="not granted", field="priority")
    assert run_cli(monkeypatch, judged(two_nodes(), refused=priority)) == jobs_cmds.EXIT_WOULD_REFUSE
    assert capsys.readouterr().out.startswith(
        "Would be refused: PriorityNotAllowed (--priority): not granted"
    )


def test_wait_is_refused_with_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="rally")
    jobs_cmds.add_parsers(parser.add_subparsers(dest="command"))
    argv = ["submit", "--dry-run", "--wait", "--gpus", "8", "--api-url", "http://127.0.0.1:1", "--", "true"]
    args = parser.parse_args(argv)
    assert args.func(args) == jobs_cmds.EXIT_ERROR
    assert capsys.readouterr().err.startswith("error: --wait:")
