"""`rally submit | jobs | nodes | cancel`: argument parsing, URL resolution, error lines, tables."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from rallypoint.cli import jobs_cmds
from rallypoint.cli.client import (
    DEFAULT_API_URL,
    ApiClient,
    ApiError,
    ApiUnreachable,
    Response,
    resolve_api_url,
)
from rallypoint.infra import free_port


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rally")
    jobs_cmds.add_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


# --- submit arguments -------------------------------------------------------------------------------


def test_submit_builds_the_request_body() -> None:
    args = parse(
        [
            "submit",
            "--gpus",
            "16",
            "--gpus-per-node",
            "8",
            "--ranks-per-node",
            "4",
            "--team",
            "nlp",
            "--priority",
            "training-high",
            "--name",
            "llama",
            "--time-limit",
            "2h30m",
            "--env",
            "NCCL_DEBUG=INFO",
            "--env",
            "EMPTY=",
            "--env",
            "X=a=b",
            "--idempotency-key",
            "ci-1",
            "--wait",
            "--api-url",
            "http://api:9",
            "--",
            "python",
            "train.py",
            "--lr",
            "3e-4",
        ]
    )
    assert args.func is jobs_cmds.cmd_submit
    assert args.wait and args.api_url == "http://api:9" and args.idempotency_key == "ci-1"
    assert jobs_cmds.build_spec(args) == {
        "name": "llama",
        "team": "nlp",
        "gpus": 16,
        "command": ["python", "train.py", "--lr", "3e-4"],
        "gpus_per_task": 8,
        "ranks_per_task": 4,
        "priority": "training-high",
        "time_limit_s": 9000,
        "env": {"NCCL_DEBUG": "INFO", "EMPTY": "", "X": "a=b"},
    }


def test_submit_sends_only_what_was_given() -> None:
    body = jobs_cmds.build_spec(parse(["submit", "--gpus", "8", "--team", "cv", "--", "sleep", "1"]))
    # No gpus_per_task: the API fills it from the cluster's node size.
    assert body == {"name": "sleep", "team": "cv", "gpus": 8, "command": ["sleep", "1"]}


def test_command_without_double_dash_keeps_its_flags() -> None:
    args = parse(["submit", "--gpus", "8", "--team", "cv", "torchrun", "--nproc-per-node", "8", "t.py"])
    assert jobs_cmds.build_spec(args)["command"] == ["torchrun", "--nproc-per-node", "8", "t.py"]


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py"], "train"),
        (["/usr/bin/Sleep", "10"], "sleep"),
        (["python3", "-m", "pkg.main"], "pkg"),
        (["torchrun", "--nproc-per-node", "8", "My Script!.py"], "my-script"),
        ([], "job"),
        (["--", "..."], "job"),
    ],
)
def test_default_name_is_a_valid_job_name(command: list[str], name: str) -> None:
    assert jobs_cmds.default_name(command) == name


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600),
        ("90m", 5400),
        ("2h30m", 9000),
        ("1d", 86400),
        ("45s", 45),
        ("10:00", 600),
        ("1:00:00", 3600),
        ("2-00:00:00", 172800),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert jobs_cmds.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1h1x", "1:2:3:4"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        jobs_cmds.parse_duration(text)


def test_bad_env_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(["submit", "--gpus", "8", "--env", "NOEQUALS", "--", "x"])
    assert caught.value.code == 2
    assert "NAME=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["submit", "--gpus", "8", "--team", "nlp"], "error: command: is required"),
        (["submit", "--gpus", "0", "--team", "nlp", "--", "x"], "error: --gpus: must be >= 1, got 0"),
        (["submit", "--gpus", "8", "--team", "NLP", "--", "x"], "error: --team: "),
        (["submit", "--gpus", "8", "--team", "nlp", "--name", "Bad Name", "--", "x"], "error: --name: "),
        (["submit", "--team", "nlp", "--", "x"], "error: --gpus: is required (or --gpu-fraction"),
        (
            ["submit", "--gpus", "2", "--gpu-fraction", "0.5", "--team", "nlp", "--", "x"],
            "error: --gpu-fraction: ",
        ),
    ],
)
def test_submit_checks_locally_before_calling(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RALLY_TEAM", raising=False)
    # An unroutable API: a local refusal must not need it.
    args = parse([*argv[:1], "--api-url", "http://127.0.0.1:1", *argv[1:]])
    assert args.func(args) == jobs_cmds.EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith(line) and "\n" not in err


def test_jobs_and_nodes_json_have_the_apis_shape(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rally jobs --json` and `rally nodes --json` print what the API answers (one JobList over every
    page, the NodeList), not a bare list: one JSON shape for scripts whichever way they ask."""
    pages = {
        None: {"jobs": [job(job_id="j-1")], "count": 1, "next_after": 7, "seq": 9},
        "7": {"jobs": [job(job_id="j-2")], "count": 1, "next_after": None, "seq": 9},
    }
    nodes = {"nodes": [{"node_id": "n0"}], "seq": 9}

    class FakeApi(ApiClient):
        def request(self, method: str, path: str, **kwargs: Any) -> Response:
            if path == "/v1/nodes":
                return Response(200, nodes, {})
            after = (kwargs.get("params") or {}).get("after")
            return Response(200, pages[None if after is None else str(after)], {})

    monkeypatch.setattr(jobs_cmds, "ApiClient", FakeApi)
    args = parse(["jobs", "--json", "--all"])
    assert args.func(args) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing == {
        "jobs": [job(job_id="j-1"), job(job_id="j-2")],
        "count": 2,
        "next_after": None,
        "seq": 9,
    }
    args = parse(["nodes", "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == nodes


def test_other_commands_parse() -> None:
    jobs = parse(["jobs", "--all", "--state", "failed", "--team", "nlp", "--json"])
    assert jobs.func is jobs_cmds.cmd_jobs and jobs.all and jobs.output == "json" and jobs.state == "failed"
    assert parse(["nodes", "--json"]).func is jobs_cmds.cmd_nodes
    cancel = parse(["cancel", "j-0123456789ab"])
    assert cancel.func is jobs_cmds.cmd_cancel and cancel.job_id == "j-0123456789ab"


# --- API URL resolution and errors ----------------------------------------------------------------------


def test_api_url_precedence(tmp_path: Path) -> None:
    (tmp_path / ".rally").mkdir()
    (tmp_path / ".rally" / "cluster.json").write_text(json.dumps({"api_url": "http://from-file:1/"}))
    env = {"RALLY_API_URL": "http://from-env:2"}
    assert resolve_api_url("http://flag:3", env=env, cwd=tmp_path) == "http://flag:3"
    assert resolve_api_url(None, env=env, cwd=tmp_path) == "http://from-env:2"
    assert resolve_api_url(None, env={}, cwd=tmp_path) == "http://from-file:1"
    assert resolve_api_url(None, env={}, cwd=tmp_path / "elsewhere") == DEFAULT_API_URL
    (tmp_path / ".rally" / "cluster.json").write_text("{half")
    assert resolve_api_url(None, env={}, cwd=tmp_path) == DEFAULT_API_URL


def test_problem_lines() -> None:
    assert (
        ApiError(422, {"field": "gpus", "detail": "asks for 999 GPUs; the cluster has 32"}).line()
        == "error: gpus: asks for 999 GPUs; the cluster has 32"
    )
    assert ApiError(404, {"detail": "job 'x' does not exist"}).line() == "error: job 'x' does not exist"
    assert ApiError(502, {}).line() == "error: HTTP 502"


def test_connection_refused_gives_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ApiUnreachable) as caught:
        ApiClient(url, timeout=2).list_nodes()
    assert "connection refused" in caught.value.line() and "rally up" in caught.value.line()
    args = parse(["jobs", "--api-url", url])
    assert args.func(args) == jobs_cmds.EXIT_ERROR
    assert capsys.readouterr().err.startswith(f"error: cannot reach the Rallypoint API at {url}")


# --- tables -------------------------------------------------------------------------------------------------


def job(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": "j-000000000001",
        "team": "nlp",
        "name": "pretrain",
        "state": "pending",
        "gpus": 16,
        "nodes": [],
        "pending_reason": {"code": "Resources", "message": "m"},
        "started_at": None,
        "bound_at": None,
        "ended_at": None,
        "reason": None,
        "exit_code": None,
        "attempt": 0,
    }
    base.update(over)
    return base


def test_jobs_table() -> None:
    jobs = [
        job(queue_position=2),
        job(
            job_id="j-000000000002",
            name="eval",
            state="running",
            gpus=8,
            nodes=["n0", "n1", "n2", "n7"],
            pending_reason=None,
            bound_at=1000.0,
            started_at=1005.0,
        ),
        job(
            job_id="j-000000000003",
            team="cv",
            state="failed",
            pending_reason=None,
            started_at=0.0,
            ended_at=3725.0,
            reason="rank 3 exited 1",
        ),
    ]
    assert jobs_cmds.format_jobs(jobs, now=1070.0).splitlines() == [
        "ID              TEAM  NAME      STATE    TIME     GPUS  START  NODES(REASON)",
        "j-000000000001  nlp   pretrain  PENDING  0:00     16    -      (Resources, #2: m)",
        "j-000000000002  nlp   eval      RUNNING  1:05     8     -      n[0-2,7]",
        "j-000000000003  cv    pretrain  FAILED   1:02:05  16    -      (rank 3 exited 1)",
    ]


def test_empty_jobs_table_is_just_the_header() -> None:
    assert jobs_cmds.format_jobs([], now=0.0) == "ID  TEAM  NAME  STATE  TIME  GPUS  START  NODES(REASON)"


def test_the_start_column_gives_a_waiting_jobs_predicted_start_from_now() -> None:
    predicted = {"status": "predicted", "p50": 1720.0, "p90": 3400.0, "runtime_p50_s": 600.0}
    waiting = {**job(job_id="j-000000000004", state="pending"), "predicted_start": predicted}
    row = jobs_cmds.format_jobs([waiting], now=1000.0).splitlines()[1]
    assert "in 12m (p90 40m)" in row
    beyond = {"status": "beyond-horizon", "horizon_s": 604800.0}
    assert jobs_cmds.start_text(beyond, now=0.0) == "beyond 7d00h"
    assert jobs_cmds.start_text({"status": "unavailable"}, now=0.0) == "unknown"
    # a dry run's start fitted into the forecast is shown as rough, and says so in full
    estimated = {**predicted, "status": "estimated", "basis": "forecast", "forecast_seq": 41}
    assert jobs_cmds.start_text(estimated, now=1000.0).startswith("~in ")
    long = jobs_cmds.start_text(estimated, now=1000.0, long=True)
    assert "estimated from the forecast of log seq 41" in long
    assert jobs_cmds.start_text({**predicted, "p50": 900.0, "p90": 900.0}, now=1000.0) == "now"


def test_nodes_table() -> None:
    nodes = [
        {
            "node_id": "n0",
            "rack": "r0",
            "status": "up",
            "gpu_type": "H100",
            "gpus": {"total": 8, "free": 0, "allocated": 8},
            "shared_gpus": {"10": 250, "2": 900},
            "mig_gpus": {
                "0": [{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 6}],
                "1": [],
            },
            "jobs": ["j-a", "j-b"],
        },
        {
            "node_id": "n1",
            "rack": "r0",
            "status": "drained",
            "health": "failed",
            "health_evidence": [
                {"signal": "xid", "subject": "gpu 3", "value": 79, "threshold": 79},
                {"signal": "ecc_uncorrectable", "subject": "gpu 3", "value": 2, "threshold": 1},
            ],
            "gpu_type": "H100",
            "gpus": {"total": 8, "free": 0, "allocated": 0},
            "jobs": [],
        },
    ]
    assert jobs_cmds.format_nodes(nodes).splitlines() == [
        "NODE  RACK  STATUS   HEALTH                           GPU_TYPE  GPUS(FREE/TOTAL)  "
        "SHARED                                                       JOBS",
        "n0    r0    UP       healthy                          H100      0/8               "
        "gpu0=mig:3g.40gb@0+1g.10gb@6,gpu1=mig:-,gpu2=0.9,gpu10=0.25  j-a,j-b",
        "n1    r0    DRAINED  failed: gpu 3 xid 79 >= 79 (+1)  H100      0/8               "
        "-                                                            -",
    ]


@pytest.mark.parametrize(
    ("nodes", "text"),
    [
        ([], ""),
        (["n3"], "n3"),
        (["n1", "n0", "n2", "n5", "gpu-a"], "gpu-a,n[0-2,5]"),
        (["n01", "n02", "n3"], "n[01-02,3]"),
        (["a1", "b1", "b2"], "a1,b[1-2]"),
    ],
)
def test_hostlist(nodes: list[str], text: str) -> None:
    assert jobs_cmds.hostlist(nodes) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (65, "1:05"), (3725, "1:02:05"), (90061, "1-01:01:01"), (-5, "0:00")]
)
def test_elapsed(seconds: float, text: str) -> None:
    assert jobs_cmds.format_elapsed(seconds) == text


def test_wait_reports_changes_and_exit_codes() -> None:
    class FakeApi(ApiClient):
        """Scripted answers for the polling loop (not the bus: the CLI only speaks HTTP)."""

        def __init__(self, answers: list[dict[str, Any]]) -> None:
            super().__init__("http://unused")
            self.answers = answers

        def get_job(self, job_id: str) -> dict[str, Any]:
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    import io

    pending = job()
    running = job(state="running", nodes=["n0", "n1"], attempt=1, pending_reason=None)
    out = io.StringIO()
    code = jobs_cmds.wait_for_job(
        FakeApi([pending, pending, running, job(state="completed")]), "j-1", out=out, sleep=lambda _: None
    )
    lines = out.getvalue().splitlines()
    assert code == 0
    assert [line.split(" ", 2)[2] for line in lines] == [
        "pending (Resources: m)",
        "running on n[0-1] (attempt 1)",
        "completed",
    ]

    def wait(answer: dict[str, Any]) -> int:
        return jobs_cmds.wait_for_job(FakeApi([answer]), "j-1", out=io.StringIO(), sleep=lambda _: None)

    # The job's own exit code passes through, as srun's does; an end without one has a code of its own.
    assert wait(job(state="failed", reason="rank 0 exited 3", exit_code=3)) == 3
    assert wait(job(state="failed", reason="rank 0 exited with code 143", exit_code=143)) == 143
    assert jobs_cmds.EXIT_JOB_ENDED_WITHOUT_CODE == 125
    for ended in (
        job(state="cancelled"),
        job(state="rejected", reason="no such queue"),
        job(state="failed", reason="time limit of 60 s exceeded", exit_code=None),
        job(state="failed", reason="rank 0 was lost", exit_code=-1),
    ):
        assert wait(ended) == 125


def test_rally_predictions_says_how_and_how_well_or_that_nothing_predicts() -> None:
    from rallypoint.cli.predictions_cmds import format_predictions

    assert format_predictions({"available": False}).startswith("No predictor answered")
    summary = {
        "available": True,
        "policy": "rallypoint",
        "computed_at_seq": 42,
        "refresh_s": 0.0123,
        "waiting_jobs": 3,
        "learned_jobs": 17,
        "accuracy": {"starts": 4, "runtimes": 10},
        "shares": {"within_1min": 0.75, "runtime_within_50pct": 0.6, "runtime_off_2x": None},
    }
    lines = format_predictions(summary).splitlines()
    assert lines[0] == (
        "Predicting 3 waiting job(s) under rallypoint at log seq 42 (refresh 0.012 s); "
        "runtimes learned from 17 ended job(s)"
    )
    assert lines[2].split() == ["start", "within", "1", "min", "of", "its", "P50", "0.750", "4"]
    assert lines[-1].split()[-2:] == ["-", "10"]
