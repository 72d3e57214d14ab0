"""A launch an agent refuses is a fact with a reason (``rallypoint.control.recovery.refusal_event``).

Given a bound gang and the agents' refusals, then the one event the controller appends: infrastructure
refusals (the node changed under the bind) requeue the job at once up to the infrastructure cap; a user
refusal (the spec cannot run) is retried with the user backoff up to ``max_retries``, then fails; a
refusal without a code (an agent older than codes) decides nothing, so the launch is retried as before.
"""

from __future__ import annotations

import msgspec
from test_recovery_decisions import CONFIG, World, submit
from test_state_fold import EIGHT, bound, node

from rallypoint.control import LaunchRefusal, refusal_event
from rallypoint.events import JobAttemptFailed, JobFailed
from rallypoint.protocol import (
    REFUSED_EMPTY_COMMAND,
    REFUSED_SUPERSEDED,
    REFUSED_UNKNOWN_GPUS,
    REFUSED_WRONG_NODE,
    LaunchReply,
)

GPUS = LaunchRefusal(node_id="n2", code=REFUSED_UNKNOWN_GPUS, error="no such GPUs on n2: [7]")
EMPTY = LaunchRefusal(node_id="n1", code=REFUSED_EMPTY_COMMAND, error="empty command")


def gang(retries: int = 0) -> World:
    return World(
        node("n1"), node("n2"), submit("j", retries=retries), bound("j", ("n1", EIGHT), ("n2", EIGHT))
    )


def test_unknown_gpus_give_every_gpu_back_and_requeue_at_once_as_an_infrastructure_failure() -> None:
    world = gang()
    event = refusal_event(world.state.jobs["j"], [GPUS], 10.0, CONFIG)
    assert event == JobAttemptFailed(
        job_id="j",
        attempt=1,
        cause="infra",
        reason="launch refused by node n2: no such GPUs on n2: [7]",
        retry_at=10.0,
        at=10.0,
    )
    job = world.given(event).state.jobs["j"]
    assert (job.state, job.infra_failures, job.user_failures) == ("pending", 1, 0)
    assert world.state.free_gpus() == 16


def test_infrastructure_refusals_past_the_cap_fail_the_job_naming_the_refusal() -> None:
    world = gang()
    for attempt in (1, 2):  # CONFIG.max_infra_retries == 2
        event = refusal_event(world.state.jobs["j"], [GPUS], 10.0 * attempt, CONFIG)
        assert isinstance(event, JobAttemptFailed)
        world.given(event, bound("j", ("n1", EIGHT), ("n2", EIGHT), attempt=attempt + 1))
    last = refusal_event(world.state.jobs["j"], [GPUS], 40.0, CONFIG)
    assert isinstance(last, JobFailed)
    assert last.reason == (
        "launch refused by node n2: no such GPUs on n2: [7]; gave up after 2 earlier infrastructure failures"
    )
    assert world.given(last).state.jobs["j"].state == "failed"


def test_a_spec_that_cannot_run_is_a_user_failure_retried_with_backoff_then_failed() -> None:
    world = gang(retries=1)
    first = refusal_event(world.state.jobs["j"], [GPUS, EMPTY], 10.0, CONFIG)
    assert first == JobAttemptFailed(
        job_id="j",
        attempt=1,
        cause="user",
        reason="launch refused by node n1: empty command",  # the user's fault wins, named once
        retry_at=10.0 + CONFIG.retry_backoff_s,
        at=10.0,
    )
    world.given(first, bound("j", ("n1", EIGHT), ("n2", EIGHT), attempt=2))
    second = refusal_event(world.state.jobs["j"], [EMPTY], 30.0, CONFIG)
    assert isinstance(second, JobFailed)
    assert second.reason.startswith(
        "launch refused by node n1: empty command on attempt 2; 2 failed attempts"
    )
    assert world.given(second).state.jobs["j"].state == "failed"


def test_without_retries_a_user_refusal_fails_the_job_at_once() -> None:
    event = refusal_event(gang().state.jobs["j"], [EMPTY], 10.0, CONFIG)
    assert event == JobFailed(
        job_id="j", attempt=1, reason="launch refused by node n1: empty command", at=10.0
    )


def test_every_infrastructure_refusal_is_named_in_node_order() -> None:
    wrong = LaunchRefusal(node_id="n1", code=REFUSED_WRONG_NODE, error="task is for node n1, this is n9")
    event = refusal_event(gang().state.jobs["j"], [GPUS, wrong], 10.0, CONFIG)
    assert isinstance(event, JobAttemptFailed) and event.cause == "infra"
    assert event.reason == (
        "launch refused by node n1: task is for node n1, this is n9; "
        "launch refused by node n2: no such GPUs on n2: [7]"
    )


def test_a_refusal_without_a_code_or_no_refusal_at_all_keeps_retrying_the_launch() -> None:
    job = gang().state.jobs["j"]
    old_agent = LaunchRefusal(node_id="n1", code="", error="empty command")
    assert refusal_event(job, [old_agent], 10.0, CONFIG) is None
    assert refusal_event(job, [], 10.0, CONFIG) is None  # only timeouts: the node may be slow
    # a launch that came too late for a node already running the next attempt says nothing of this one
    late = LaunchRefusal(node_id="n1", code=REFUSED_SUPERSEDED, error="attempt 2 of j runs here")
    assert refusal_event(job, [late], 10.0, CONFIG) is None


def test_an_older_agents_reply_without_a_code_still_decodes() -> None:
    reply = msgspec.json.decode(b'{"ok": false, "error": "empty command"}', type=LaunchReply)
    assert (reply.ok, reply.code) == (False, "")
    new = LaunchReply(ok=False, error="empty command", code=REFUSED_EMPTY_COMMAND)
    assert msgspec.json.decode(msgspec.json.encode(new), type=LaunchReply) == new
