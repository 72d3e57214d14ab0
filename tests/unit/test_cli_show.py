"""What `rally show`, `rally nodes` and `rally nodes drain` print of a drain, a lost node and a recovered
job: the API's JSON (built here by the same pure functions the API calls) through the CLI's formatting."""

from __future__ import annotations

import shlex
import time
from typing import Any

import msgspec
from rallypoint_services.api.views import Audience, render_job_drain, render_node
from test_drain_plan import Story, drained, job
from test_state_fold import EIGHT, bound, node

from rallypoint.cli.account_format import format_show
from rallypoint.cli.jobs_cmds import format_nodes
from rallypoint.cli.node_cmds import drain_text
from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, job_drain
from rallypoint.events import JobStarted, NodeHeartbeatLost, NodeLost
from rallypoint.jobs.history import job_history

WAIT = DEFAULT_DRAIN_POLICY.checkpoint_wait_s


def shown(story: Story, job_id: str = "j1") -> str:
    """`rally show JOB`'s text, from the history the API serves (with its live drain plan)."""
    history = job_history(story.events, job_id)
    assert history is not None
    history.drain = render_job_drain(
        job_drain(story.state.jobs[job_id], story.state, DEFAULT_DRAIN_POLICY), Audience(None, {})
    )
    return format_show(msgspec.to_builtins(history))


def nodes_table(story: Story) -> list[str]:
    admin = Audience(None, story.state.jobs)
    return format_nodes([render_node(n, admin) for _, n in sorted(story.state.nodes.items())]).splitlines()


def line(text: str, prefix: str) -> str:
    [found] = [row.strip() for row in text.splitlines() if row.strip().startswith(prefix)]
    return found


def test_show_prints_the_command_shell_quoted() -> None:
    text = shown(Story(node("n1"), *job("j1", "production", "n1")))
    command = line(text, "Command=").removeprefix("Command=")
    assert command == "python train.py --note 'two words'"
    assert shlex.split(command) == ["python", "train.py", "--note", "two words"]


def test_show_says_what_the_drain_does_to_the_job_and_by_when() -> None:
    story = Story(node("n1"), *job("j1", "training-standard", "n1"), drained())
    drain = line(shown(story), "Drain=")
    assert drain.startswith("Drain=n1 (maintenance): interrupted")
    assert "no checkpoint committed yet" in drain
    undrained = shown(Story(node("n1"), *job("j1", "training-standard", "n1")))
    assert "Drain=" not in undrained


def test_show_of_a_job_running_again_gives_the_interruption_its_own_label() -> None:
    story = Story(node("n1"), node("n2"), *job("j1", "development", "n1"), drained())
    [then] = story.controller("j1", 31.0)
    story.given(then, bound("j1", ("n2", EIGHT), attempt=2), JobStarted(job_id="j1", attempt=2, at=40.0))
    text = shown(story)
    assert "JobState=RUNNING Reason=-" in text
    assert line(text, "LastInterruption=") == "LastInterruption=node n1 was drained (maintenance)"
    attempts = text.split("Attempts:")[1]
    assert " drained " in attempts and "attempt-failed" not in attempts


def test_nodes_shows_a_lost_node_lost_and_a_draining_one_with_its_jobs_plans() -> None:
    lost = (
        NodeHeartbeatLost(node_id="n3", last_seen=20.0, at=25.0),
        NodeLost(node_id="n3", reason="silent", at=30.0),
    )
    story = Story(node("n1"), node("n2"), node("n3"), node("n4"), *job("j1", "development", "n1"))
    story.given(*job("j2", "production", "n2"), drained("n2"), drained("n4"), *lost)
    rows = {row.split()[0]: row.split() for row in nodes_table(story)[1:]}
    assert rows["n1"][2:4] == ["UP", "healthy"]
    assert rows["n2"][2] == "DRAINING" and rows["n2"][6:] == [
        "-",
        "j2",
        "at-deadline",
        "by",
        _clock(30.0 + WAIT),
    ]
    assert rows["n3"][2:4] == ["LOST", "-"], "a lost node is not healthy"
    assert rows["n4"][2] == "DRAINED"


def test_nodes_shows_a_node_cordoned_by_its_health_as_degraded() -> None:
    node_view: dict[str, Any] = {
        "node_id": "n1",
        "rack": "r0",
        "status": "up",
        "health": "degraded",
        "health_evidence": [],
        "gpu_type": "H100",
        "gpus": {"total": 8, "free": 0, "allocated": 0},
        "jobs": [],
        "draining_jobs": [],
    }
    assert format_nodes([node_view]).splitlines()[1].split()[2] == "DEGRADED"


def test_drain_prints_each_jobs_plan() -> None:
    story = Story(node("n1"), node("n2"), *job("j1", "training-standard", "n1"), drained())
    node_view = render_node(story.state.nodes["n1"], Audience(None, story.state.jobs))
    text = drain_text("n1", "maintenance", node_view, now=40.0)
    head, plan = text.splitlines()
    assert head.startswith("node n1 drained (maintenance): no new work will be placed on it; its 1 job(s)")
    assert plan.startswith(f"  j1: interrupted at {_clock(30.0 + WAIT)} (in 29m50s)")
    empty = render_node(story.state.nodes["n2"], Audience(None, story.state.jobs))
    assert drain_text("n2", "maintenance", empty, now=40.0).endswith("; no job runs on it")


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))
