"""The rank's sandbox: which folders it covers and which paths it puts back (pure), and its rank
environment's allow-list (issue 30, item 1)."""

from __future__ import annotations

import stat
import sys

import pytest

from rallypoint.agent.ranksandbox import (
    Cover,
    deepest_existing,
    first_blocked,
    may_enter,
    outermost,
    plan,
    rank_paths,
)
from rallypoint.jobs.launch import inherited_environment, rank_environment
from rallypoint.protocol import LaunchTask, RankSpec

NOBODY, NOGROUP = 65534, 65534


def blocked_by(*folders: str) -> object:
    """A ``can_enter`` that refuses exactly ``folders``."""
    return lambda folder: folder not in folders


@pytest.mark.parametrize(
    ("mode", "owner", "group", "uid", "expected"),
    [
        (0o700, 0, 0, NOBODY, False),  # /root
        (0o755, 0, 0, NOBODY, True),
        (0o710, 0, NOGROUP, NOBODY, True),  # entered through its group
        (0o071, NOBODY, 0, NOBODY, False),  # the owner's bits decide for the owner, not the others'
        (0o100, NOBODY, 0, NOBODY, True),
        (0o700, 1000, 1000, 0, True),  # root enters anything
    ],
)
def test_who_may_enter_a_folder(mode: int, owner: int, group: int, uid: int, expected: bool) -> None:
    assert may_enter(stat.S_IFDIR | mode, owner, group, uid, NOGROUP) is expected


def test_the_outermost_blocked_ancestor_is_covered() -> None:
    can_enter = blocked_by("/root", "/root/.pyenv/versions")
    assert first_blocked("/root/.pyenv/versions/3.11.7", can_enter) == "/root"  # type: ignore[arg-type]
    assert first_blocked("/usr/lib/python3", can_enter) is None  # type: ignore[arg-type]
    # the path itself is not its own ancestor: its own mode is its own business
    assert first_blocked("/root", can_enter) is None  # type: ignore[arg-type]


def test_paths_inside_another_are_put_back_with_it() -> None:
    assert outermost(["/a/b/c", "/a/b", "/a/bc", "/x/", "/a/b/c/d"]) == ["/a/b", "/a/bc", "/x"]


def test_plan_groups_the_paths_under_each_cover_and_leaves_reachable_ones_alone() -> None:
    can_enter = blocked_by("/root", "/tmp/pytest-of-root", "/srv/agent/work")
    paths = [
        "/root/.pyenv/versions/3.11.7/bin",
        "/root/.pyenv/versions/3.11.7",
        "/root/venv",
        "/opt/checkout/libs",
        "/tmp/pytest-of-root/pytest-1/t0/work/job/0",
        "/srv/agent/work/job-a/3",
    ]
    assert plan(paths, can_enter) == (  # type: ignore[arg-type]
        Cover("/root", ("/root/.pyenv/versions/3.11.7", "/root/venv")),
        Cover("/srv/agent/work", ("/srv/agent/work/job-a/3",)),
        Cover("/tmp/pytest-of-root", ("/tmp/pytest-of-root/pytest-1/t0/work/job/0",)),
    )
    assert plan(["/usr", "/opt/checkout/libs"], can_enter) == ()  # type: ignore[arg-type]
    # a reachable folder listed too (a checkpoint root's nearest existing ancestor: /) hides nothing
    assert plan(["/", "/root/venv"], can_enter) == (Cover("/root", ("/root/venv",)),)  # type: ignore[arg-type]


def test_a_checkpoint_folder_not_made_yet_is_reached_through_its_nearest_existing_ancestor() -> None:
    existing = {"/ckpt", "/ckpt/root"}
    assert deepest_existing("/ckpt/root/job-1/sub", existing.__contains__) == "/ckpt/root"
    assert deepest_existing("/nowhere/at/all", existing.__contains__) == "/"


def test_a_rank_needs_the_interpreter_the_package_and_its_own_folders(tmp_path: object) -> None:
    paths = rank_paths("/srv/work/job/0", "/ckpt/job-that-does-not-exist-yet", ["/no/such/dataset", "/usr"])
    assert "/usr" in paths and "/no/such/dataset" not in paths  # a bind of nothing would stop every rank
    assert "/srv/work/job/0" in paths
    assert any(sys.base_prefix.startswith(p) or p.startswith(sys.base_prefix) for p in paths)
    assert "/" in paths  # the checkpoint folder's nearest existing ancestor: / here
    import rallypoint

    package = rallypoint.__file__
    assert any(package.startswith(p + "/") for p in paths)


SECRETS = {
    "RALLY_NATS_USER": "agent-node-1",
    "RALLY_NATS_PASSWORD": "s3cret",
    "RALLY_NATS_PASSWORD_FILE": "/run/secrets/nats",
    "RALLY_POSTGRES_DSN": "postgresql://u:p@db/rally",
    "RALLY_TOKEN": "tok",
    "AWS_SECRET_ACCESS_KEY": "k",
    "PYTHONPATH": "/agent/only",
}


def test_a_rank_inherits_only_the_allow_listed_part_of_the_agents_environment() -> None:
    agent_env = {**SECRETS, "PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TMPDIR": "/scratch"}
    assert inherited_environment(agent_env) == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TMPDIR": "/scratch",
    }
    task = LaunchTask(
        job_id="j",
        attempt=2,
        node_id="node-1",
        node_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=20001,
        ranks=(RankSpec(rank=0, local_rank=0, gpus=(3,)),),
        command=("true",),
        env={"WANDB_PROJECT": "mine", "RANK": "forged", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
    )
    env = rank_environment(task, task.ranks[0], agent_env)
    assert set(SECRETS).isdisjoint(env)
    # the job's own env reaches it, the contract wins over it
    assert (env["WANDB_PROJECT"], env["RANK"], env["RALLY_ATTEMPT"]) == ("mine", "0", "2")
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert rank_environment(task, task.ranks[0], {})["CUDA_VISIBLE_DEVICES"] == "3"
