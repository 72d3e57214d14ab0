"""Elastic jobs as the user types them (issue 31): `--gpus 8 --min-gpus 4 --max-gpus 16` is accepted on
8-GPU nodes (tasks of 4), a refusal names the flags the user typed and says how to fix it, the help says
where tasks land as the scheduler places them, and `rally jobs` shows the GPUs a grown gang holds.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from rallypoint.cli.account_format import format_show
from rallypoint.cli.jobs_cmds import SUBMIT_FLAGS, flag_error, format_jobs, gpus_held
from rallypoint.cli.main import build_parser
from rallypoint.core import ClusterModel, Node, PendingJob, Snapshot, policy_by_name, schedule
from rallypoint.jobs import SpecError, validate_spec
from rallypoint.jobs.validate import KNOWN_FIELDS

NODE_GPUS = 8


def spec(**fields: Any) -> dict[str, Any]:
    return {"name": "elastic", "team": "nlp", "command": ["python", "train.py"], **fields}


def submit_parser() -> argparse.ArgumentParser:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser: argparse.ArgumentParser = action.choices["submit"]
    return parser


# --- accepted as typed ------------------------------------------------------------------------------


def test_the_issues_elastic_job_runs_in_tasks_that_divide_every_size() -> None:
    job = validate_spec(spec(gpus=8, min_gpus=4, max_gpus=16), max_gpus_per_node=NODE_GPUS)
    assert (job.gpus_per_task, job.ranks_per_task, job.min_gpus, job.max_gpus, job.gpu_step) == (
        4,
        4,
        4,
        16,
        4,
    )


@pytest.mark.parametrize(
    ("fields", "per_task"),
    [
        ({"gpus": 16, "min_gpus": 8, "max_gpus": 32}, 8),  # whole nodes still divide every size: unchanged
        ({"gpus": 8, "min_gpus": 6, "max_gpus": 12}, 2),
        ({"gpus": 16, "min_gpus": 8, "gpu_step": 4}, 4),  # 8, 12, 16: the step counts too
        ({"gpus": 12}, None),  # not elastic: the default stays min(gpus, node size), refused as before
    ],
)
def test_the_default_task_size_divides_every_size_the_job_may_take(
    fields: dict[str, int], per_task: int | None
) -> None:
    if per_task is None:
        with pytest.raises(SpecError) as caught:
            validate_spec(spec(**fields), max_gpus_per_node=NODE_GPUS)
        assert caught.value.field == "gpus_per_task"
        return
    assert validate_spec(spec(**fields), max_gpus_per_node=NODE_GPUS).gpus_per_task == per_task


# --- refusals name the flags and the fix ----------------------------------------------------------


def test_a_task_size_the_user_chose_is_refused_with_the_one_that_would_do() -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(spec(gpus=8, min_gpus=4, max_gpus=16, gpus_per_task=8), max_gpus_per_node=NODE_GPUS)
    err = caught.value
    assert err.field == "min_gpus"  # the API's problem+json names its own field
    assert err.detail == (
        "4 is not a multiple of gpus_per_task=8; every size is a whole number of tasks: set gpus_per_task=4 "
        "(it divides 4, 8, 16)"
    )
    # the CLI names what the user typed, the fix included
    assert flag_error(err.field, err.detail) == (
        "error: --min-gpus: 4 is not a multiple of --gpus-per-node=8; every size is a whole number of tasks: "
        "set --gpus-per-node=4 (it divides 4, 8, 16)"
    )


@pytest.mark.parametrize(
    ("field", "detail", "line"),
    [
        ("gpus_per_task", "defaults to 8, which does not divide gpus=12; set it explicitly",
         "error: --gpus-per-node: defaults to 8, which does not divide --gpus=12; set it explicitly"),
        ("gpu_step", "only meaningful for an elastic job (set min_gpus or max_gpus)",
         "error: --gpu-step: only meaningful for an elastic job (set --min-gpus or --max-gpus)"),
        ("secrets.TOKEN", "is also in env; a variable is either plain or secret",
         "error: --secret TOKEN: is also in env; a variable is either plain or secret"),
        ("topology_preferred", "'rack' is wider than topology_required='node'",
         "error: --prefer-topology: 'rack' is wider than --topology='node'"),
        (None, "asks for 999 GPUs; the cluster has 32", "error: asks for 999 GPUs; the cluster has 32"),
        ("gpus", "must be >= 1, got 0", "error: --gpus: must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_api_fields_become_the_flags_that_set_them(field: str | None, detail: str, line: str) -> None:
    assert flag_error(field, detail) == line


def test_every_mapped_field_is_a_spec_field_and_every_flag_is_submits() -> None:
    flags = {option for action in submit_parser()._actions for option in action.option_strings}
    assert set(SUBMIT_FLAGS) <= KNOWN_FIELDS
    assert set(SUBMIT_FLAGS.values()) <= flags


# --- where tasks land: the help says what the placement does --------------------------------------


def test_two_tasks_of_a_gang_may_share_a_node_as_the_help_says() -> None:
    cluster = ClusterModel([Node(id=n, rack="r0", gpus=NODE_GPUS) for n in ("n0", "n1")])
    job = PendingJob(id="j", team="t", gpus=8, gpus_per_task=4, submit_time=0)
    (bind,) = schedule(Snapshot(now=0.0, cluster=cluster, pending=(job,)), policy_by_name("rallypoint")).binds
    assert [p.node_id for p in bind.placements] == ["n0", "n0"]  # best fit packs the gang on one node
    (help_text,) = [a.help for a in submit_parser()._actions if "--gpus-per-node" in a.option_strings]
    assert help_text is not None and "one task per node" not in help_text
    assert "a node with room may run several tasks of the gang" in help_text


# --- rally jobs: what the gang holds now, and its range --------------------------------------------


def view(gpus: int, allocation: list[list[int]], **spec_fields: int) -> dict[str, Any]:
    placed = [{"task": i, "node_id": f"n{i}", "gpus": g} for i, g in enumerate(allocation)]
    waiting = {"code": "Resources", "message": "needs 8 GPUs"}
    return {
        "job_id": "j-1",
        "team": "nlp",
        "name": "elastic",
        "state": "running" if allocation else "pending",
        "gpus": gpus,
        "allocation": placed,
        "nodes": [p["node_id"] for p in placed],
        "started_at": 0.0,
        "spec": {"gpus": gpus, **spec_fields},
        "pending_reason": None if allocation else waiting,
    }


def test_rally_jobs_shows_the_gpus_a_grown_gang_holds_and_its_range() -> None:
    grown = view(8, [list(range(8)), list(range(8))], min_gpus=8, max_gpus=16)
    assert gpus_held(grown) == "16 (8-16)"
    assert gpus_held(view(8, [], min_gpus=4, max_gpus=16)) == "8 (4-16)"  # waiting: what it asks
    assert gpus_held(view(8, [list(range(8))])) == "8"  # a fixed-size job: as before
    table = format_jobs([grown], now=60.0).splitlines()
    assert table[0].split() == ["ID", "TEAM", "NAME", "STATE", "TIME", "GPUS", "START", "NODES(REASON)"]
    assert table[1].split()[4:7] == ["1:00", "16", "(8-16)"]


def test_rally_show_gives_the_gpus_of_the_attempt_under_way_and_the_range() -> None:
    spec_fields = {
        "name": "elastic",
        "team": "nlp",
        "priority": "best-effort",
        "gpus": 8,
        "gpus_per_task": 8,
        "ranks_per_task": 2,
        "max_retries": 0,
        "time_limit_s": None,
        "command": ["python", "t.py"],
        "min_gpus": 8,
        "max_gpus": 16,
    }
    tasks = [{"task": i, "node_id": f"n{i}", "gpus": list(range(8))} for i in range(2)]
    attempt = {
        "attempt": 1,
        "outcome": "running",
        "placements": tasks,
        "gpus": 16,
        "started_at": 1.0,
        "ended_at": None,
        "reason": "",
        "preempted_for": None,
    }
    history = {
        "job_id": "j-1",
        "spec": spec_fields,
        "state": "running",
        "reason": "",
        "exit_code": None,
        "queue": "nlp",
        "submitted_at": 0.0,
        "ended_at": None,
        "lost_gpu_s": 0.0,
        "attempts": [attempt],
        "reasons": [],
        "preemptions": [],
        "recovery": [],
        "checkpoints": [],
    }
    assert "   Gpus=16 (8-16) GpusPerNode=8 " in format_show(history)
    # once it has ended, what it asked
    ended = {**history, "state": "completed", "attempts": [{**attempt, "ended_at": 9.0}]}
    assert "   Gpus=8 (8-16) GpusPerNode=8 " in format_show(ended)
