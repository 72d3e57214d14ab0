"""What a drain says it will do to each job, and what the job's story says once it did it.

The plan is the job controller's own rule (``control.drain.drain_plan``: ``eviction_at`` is its
deadline), shown by the API's job and node views; the attempt a drain ended reads ``drained``, not
``attempt-failed``; a job running again shows no stale reason, only its last interruption. Folds through
the wire format like the services; the controller's answer is ``reconcile``.
"""

from __future__ import annotations

import msgspec
from rallypoint_services.api.views import Audience, render_job, render_node
from test_recovery_decisions import committed
from test_state_fold import EIGHT, LEADERS, bound, node

from rallypoint.accounting import fold_attempts
from rallypoint.control import RecoveryConfig, reconcile
from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, DrainPlan, drain_plan, eviction_at, job_drain
from rallypoint.events import (
    Event,
    JobAttemptFailed,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeatLost,
    NodeLost,
    decode,
    encode,
)
from rallypoint.jobs.history import job_history
from rallypoint.state import ClusterState

WAIT = DEFAULT_DRAIN_POLICY.checkpoint_wait_s
CONFIG = RecoveryConfig(checkpoint_root="/ckpt")


class Story:
    """The log of one small cluster: ``given`` appends events (through the wire format) to a fold and
    keeps them, so the same history feeds the fold, the attempt ledger and ``job_history``."""

    def __init__(self, *events: Event) -> None:
        self.events: list[tuple[int, Event]] = []
        self.state = ClusterState()
        for leader in LEADERS:
            self._append(leader)
        self.given(*events)

    def _append(self, event: Event) -> None:
        seq = len(self.events) + 1
        decoded = decode(encode(event))
        self.events.append((seq, decoded))
        self.state.apply(seq, decoded)

    def given(self, *events: Event) -> Story:
        for event in events:
            self._append(event)
        return self

    def controller(self, job_id: str, now: float) -> list[Event]:
        """What the job controller appends for ``job_id`` at ``now``."""
        actions = reconcile(self.state.jobs[job_id], self.state, now, recovery=CONFIG)
        return [then for a in actions if (then := getattr(a, "then", None)) is not None]


def job(job_id: str, priority: str, *nodes: str) -> list[Event]:
    """``job_id`` of ``priority``: 8 GPUs on each of ``nodes``, running since t=10."""
    spec = JobSpec(
        name=job_id,
        team="nlp",
        gpus=8 * len(nodes),
        gpus_per_task=8,
        ranks_per_task=1,
        command=("python", "train.py", "--note", "two words"),
        priority=priority,
    )
    return [
        JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0),
        bound(job_id, *((n, EIGHT) for n in nodes)),
        JobStarted(job_id=job_id, attempt=1, at=10.0),
    ]


def drained(node_id: str = "n1", at: float = 30.0) -> NodeDrained:
    return NodeDrained(node_id=node_id, reason="maintenance", at=at, drained_by="ops")


def plan_of(story: Story, job_id: str = "j1", node_id: str = "n1") -> DrainPlan | None:
    return drain_plan(story.state.jobs[job_id], story.state.nodes[node_id], DEFAULT_DRAIN_POLICY)


# --- the plan ------------------------------------------------------------------------------------


def test_a_node_in_service_has_no_plan() -> None:
    story = Story(node("n1"), *job("j1", "production", "n1"))
    assert plan_of(story) is None
    assert job_drain(story.state.jobs["j1"], story.state, DEFAULT_DRAIN_POLICY) is None


def test_a_class_drained_at_once_is_interrupted_now() -> None:
    story = Story(node("n1"), *job("j1", "development", "n1"), drained())
    assert plan_of(story) == DrainPlan(plan="now", deadline=30.0, detail="class development drains at once")


def test_a_job_that_checkpoints_waits_for_its_next_checkpoint_until_the_deadline() -> None:
    story = Story(node("n1"), *job("j1", "production", "n1"), committed(4, at=20.0), drained())
    plan = plan_of(story)
    assert plan is not None and (plan.plan, plan.deadline) == ("after-checkpoint", 30.0 + WAIT)
    story.given(committed(5, at=40.0))  # its next checkpoint: nothing left to lose, it goes now
    assert plan_of(story) == DrainPlan(
        plan="now", deadline=40.0, detail="checkpointed since the drain: nothing to lose"
    )


def test_a_job_without_a_checkpoint_runs_until_the_deadline_and_the_plan_says_so() -> None:
    # The case: a job without checkpoints on a drained node was still running 80 s later
    # (by design: it may end or checkpoint first); the plan says until when.
    story = Story(node("n1"), *job("j1", "training-standard", "n1"), drained())
    plan = plan_of(story)
    assert plan is not None and (plan.plan, plan.deadline) == ("at-deadline", 30.0 + WAIT)
    assert "no checkpoint" in plan.detail
    assert story.controller("j1", 110.0) == [], "80 s later it still runs there, as planned"
    [then] = story.controller("j1", 30.0 + WAIT)
    assert isinstance(then, JobAttemptFailed) and then.cause == "infra"


def test_a_failed_node_is_left_now_and_a_finish_class_never_has_to() -> None:
    policy = msgspec.structs.replace(DEFAULT_DRAIN_POLICY, by_class={"production": "finish"})
    story = Story(node("n1"), *job("j1", "production", "n1"), drained())
    plan = drain_plan(story.state.jobs["j1"], story.state.nodes["n1"], policy)
    assert plan is not None and (plan.plan, plan.deadline) == ("at-deadline", None)
    assert eviction_at(story.state.jobs["j1"], story.state.nodes["n1"], policy) is None


def service_on_drained_node() -> Story:
    """A production service ``svc`` running on ``n1``, drained at t=30."""
    submitted, *rest = job("svc", "production", "n1")
    assert isinstance(submitted, JobSubmitted)
    service = msgspec.structs.replace(submitted, spec=msgspec.structs.replace(submitted.spec, kind="service"))
    return Story(node("n1"), service, *rest, drained())


def test_a_service_leaves_a_drained_node_at_once_whatever_its_class() -> None:
    # production drains after a checkpoint and finish never: either would pin the node under a service
    policy = msgspec.structs.replace(DEFAULT_DRAIN_POLICY, by_class={"production": "finish"})
    story = service_on_drained_node()
    plan = drain_plan(story.state.jobs["svc"], story.state.nodes["n1"], policy)
    assert plan is not None and (plan.plan, plan.deadline) == ("now", 30.0) and "service" in plan.detail
    [then] = story.controller("svc", 31.0)  # stopped (SIGTERM, grace) and back in the queue, not ended
    assert isinstance(then, JobAttemptFailed) and then.cause == "infra" and then.retry_at == 31.0


def test_a_service_outlives_the_infrastructure_retry_cap_waiting_out_the_backoff() -> None:
    story = service_on_drained_node()
    story.state.jobs["svc"].infra_failures = CONFIG.max_infra_retries + 1  # drained and lost all its life
    [then] = story.controller("svc", 31.0)  # not JobFailed, as a training job would be: requeued, later
    assert isinstance(then, JobAttemptFailed) and then.cause == "infra"
    assert then.retry_at == 31.0 + CONFIG.retry_backoff_s * 2, then


def test_the_plan_is_the_controllers_deadline() -> None:
    story = Story(node("n1"), *job("j1", "production", "n1"), committed(4, at=20.0), drained())
    plan = plan_of(story)
    assert plan is not None and plan.deadline is not None
    assert eviction_at(story.state.jobs["j1"], story.state.nodes["n1"], DEFAULT_DRAIN_POLICY) == plan.deadline
    assert story.controller("j1", plan.deadline - 1) == []
    assert story.controller("j1", plan.deadline)


def test_a_gang_on_two_draining_nodes_shows_the_one_it_leaves_first() -> None:
    story = Story(node("n1"), node("n2"), *job("j1", "production", "n1", "n2"), drained("n2", at=50.0))
    story.given(drained("n1", at=60.0))
    found = job_drain(story.state.jobs["j1"], story.state, DEFAULT_DRAIN_POLICY)
    assert found is not None and (found.node_id, found.plan.deadline) == ("n2", 50.0 + WAIT)
    assert found.reason == "maintenance"


# --- the API's views -----------------------------------------------------------------------------


def test_the_job_and_node_views_carry_the_plan() -> None:
    story = Story(node("n1"), node("n2"), *job("j1", "production", "n1"), *job("j2", "development", "n2"))
    state = story.given(drained("n1"), drained("n2")).state
    admin = Audience(None, state.jobs)
    drain = job_drain(state.jobs["j1"], state, DEFAULT_DRAIN_POLICY)
    view = render_job(state.jobs["j1"], {}, admin, drain)
    assert view["drain"] == {
        "node": "n1",
        "reason": "maintenance",
        "plan": "at-deadline",
        "deadline": 30.0 + WAIT,
        "detail": drain.plan.detail if drain else None,
    }
    assert render_node(state.nodes["n2"], admin)["draining_jobs"] == [
        {"job_id": "j2", "plan": "now", "deadline": 30.0, "detail": "class development drains at once"}
    ]
    assert render_job(state.jobs["j1"], {}, admin)["drain"] is None
    # a team sees its own jobs' plans only
    cv = Audience("cv", state.jobs)
    assert render_node(state.nodes["n1"], cv)["draining_jobs"] == []


# --- the job's story once the drain acted --------------------------------------------------------


def test_an_attempt_ended_by_a_drain_reads_drained_not_attempt_failed() -> None:
    story = Story(node("n1"), *job("j1", "development", "n1"), drained())
    [then] = story.controller("j1", 31.0)
    assert isinstance(then, JobAttemptFailed) and then.cause == "infra"
    story.given(then)
    _, ledger = fold_attempts(story.events)
    assert [(a.attempt, a.outcome) for a in ledger.of("j1")] == [(1, "drained")]
    history = job_history(story.events, "j1")
    assert history is not None and [s.kind for s in history.recovery] == ["drained"]


def test_an_attempt_ended_by_a_lost_node_reads_interrupted() -> None:
    lost = (
        NodeHeartbeatLost(node_id="n1", last_seen=20.0, at=25.0),
        NodeLost(node_id="n1", reason="silent", at=30.0),
    )
    story = Story(node("n1"), *job("j1", "production", "n1"), *lost)
    [then] = story.controller("j1", 31.0)
    story.given(then)
    _, ledger = fold_attempts(story.events)
    assert [a.outcome for a in ledger.of("j1")] == ["interrupted"]


def test_a_job_running_again_shows_its_last_interruption_not_a_reason() -> None:
    story = Story(node("n1"), node("n2"), *job("j1", "development", "n1"), drained())
    [then] = story.controller("j1", 31.0)
    story.given(then)
    pending = render_job(story.state.jobs["j1"], {}, Audience(None, story.state.jobs))
    assert "node n1 was drained (maintenance)" in pending["reason"] and pending["last_interruption"] is None
    story.given(
        bound("j1", ("n2", EIGHT), attempt=2),
        JobStarted(job_id="j1", attempt=2, at=40.0),
    )
    running = render_job(story.state.jobs["j1"], {}, Audience(None, story.state.jobs))
    assert running["reason"] is None and "was drained" in running["last_interruption"]
    story.given(JobCompleted(job_id="j1", attempt=2, at=50.0))
    history = job_history(story.events, "j1")
    assert history is not None and history.state == "completed"
    assert history.reason == "" and "was drained" in history.last_interruption
