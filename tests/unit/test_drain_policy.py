"""Given/when/then: what a running gang does when a node under it is drained, cordoned or failed.

Folds through the wire format like the services (``World`` of test_recovery_decisions); the controller's
answer is ``reconcile`` and its next look without an event is ``wake_at``.
"""

from __future__ import annotations

import msgspec
import pytest
from test_recovery_decisions import World, committed
from test_state_fold import EIGHT, bound, node

from rallypoint.control import RecoveryConfig, reconcile, wake_at
from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, DrainPolicy, eviction_at, parse_drain_policy
from rallypoint.events import (
    Event,
    GangRepaired,
    HealthEvidence,
    JobInterrupted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeDrained,
    NodeHealthChanged,
    NodeHealthState,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
)

SLOW = HealthEvidence(
    signal="straggler", subject="job j1 rank 0", severity="degraded", value=3.1, threshold=1.4, window_s=300
)
XID = HealthEvidence(signal="xid", subject="gpu 3", severity="failed", value=79, threshold=79, hard=True)
CONFIG = RecoveryConfig(checkpoint_root="/ckpt", drain=DEFAULT_DRAIN_POLICY)


def gang(priority: str) -> World:
    """j1 of ``priority``: 16 GPUs on n1 and n2, running since t=10; n3 and n4 are free."""
    spec = JobSpec(
        name="j1",
        team="nlp",
        gpus=16,
        gpus_per_task=8,
        ranks_per_task=1,
        command=("train",),
        priority=priority,
    )
    return World(
        node("n1", rack="r0"),
        node("n2", rack="r1"),
        node("n3", rack="r0"),
        node("n4", rack="r1"),
        JobSubmitted(job_id="j1", spec=spec, submitted_at=2.0),
        bound("j1", ("n1", EIGHT), ("n2", EIGHT)),
        JobStarted(job_id="j1", attempt=1, at=10.0),
    )


def health(state: NodeHealthState, at: float, previous: NodeHealthState = "healthy") -> NodeHealthChanged:
    evidence = {"failed": (XID,), "degraded": (SLOW,)}.get(state, ())
    return NodeHealthChanged(node_id="n1", state=state, previous=previous, evidence=evidence, at=at)


def look(world: World, now: float, config: RecoveryConfig = CONFIG) -> list[Event]:
    """What the controller appends for j1 at ``now`` (the ``then`` of its kill), or nothing."""
    actions = reconcile(world.state.jobs["j1"], world.state, now, recovery=config)
    return [a.then for a in actions if getattr(a, "then", None) is not None]


@pytest.mark.parametrize("priority", ["production", "training-standard", "best-effort"])
def test_a_failed_node_is_left_at_once_whatever_the_class(priority: str) -> None:
    world = gang(priority).given(health("failed", at=30.0, previous="degraded"))
    n1 = world.state.nodes["n1"]
    assert n1.status == "drained" and not n1.schedulable and "gpu 3 xid 79" in n1.status_reason
    [then] = look(world, 30.5)
    assert isinstance(then, JobInterrupted) and then.failed_nodes == ("n1",)


def test_a_degraded_node_is_cordoned_and_a_development_gang_leaves_it_at_once() -> None:
    world = gang("development").given(health("degraded", at=30.0))
    n1 = world.state.nodes["n1"]
    assert n1.status == "up" and n1.cordoned and not n1.schedulable and n1.out_since == 30.0
    [then] = look(world, 30.5)
    assert isinstance(then, JobInterrupted) and then.failed_nodes == ("n1",)
    assert "cordoned: degraded" in then.reason and "straggler 3.1 >= 1.4 in 300 s" in then.reason


def test_checkpoint_class_leaves_after_its_next_checkpoint_not_before() -> None:
    world = gang("training-standard").given(committed(4, at=20.0), health("degraded", at=30.0))
    assert look(world, 100.0) == []  # the checkpoint at 20 is older than the cordon: wait for the next
    job = world.state.jobs["j1"]
    assert wake_at(job, world.state, CONFIG) == 30.0 + DEFAULT_DRAIN_POLICY.checkpoint_wait_s
    world.given(committed(5, at=120.0))
    [then] = look(world, 121.0)
    assert isinstance(then, JobInterrupted) and then.failed_nodes == ("n1",)


def test_checkpoint_class_leaves_at_the_deadline_when_no_checkpoint_comes() -> None:
    config = msgspec.structs.replace(CONFIG, drain=DrainPolicy(checkpoint_wait_s=600.0))
    world = gang("production").given(health("degraded", at=30.0))
    assert look(world, 629.0, config) == []
    assert wake_at(world.state.jobs["j1"], world.state, config) == 630.0
    [then] = look(world, 630.0, config)
    assert isinstance(then, JobInterrupted)


def test_finish_class_runs_to_its_end_on_a_drained_node() -> None:
    config = msgspec.structs.replace(CONFIG, drain=parse_drain_policy("production=finish"))
    world = gang("production").given(
        NodeDrained(node_id="n1", reason="maintenance", at=30.0, drained_by="ops")
    )
    assert look(world, 10_000.0, config) == []
    assert wake_at(world.state.jobs["j1"], world.state, config) is None
    assert not world.state.nodes["n1"].schedulable


def test_the_replacement_never_lands_on_a_cordoned_node() -> None:
    # n3 (same rack as n1) is degraded too: the repair must take n4 instead.
    world = gang("development").given(
        health("degraded", at=30.0),
        NodeHealthChanged(node_id="n3", state="degraded", previous="healthy", evidence=(SLOW,), at=30.0),
    )
    [then] = look(world, 31.0)
    world.given(then)
    [repair] = world.repairs(now=32.0)
    assert isinstance(repair, GangRepaired)
    assert sorted(p.node_id for p in repair.placements) == ["n2", "n4"]


def test_soft_faults_return_on_a_healthy_verdict_hard_ones_only_on_undrain() -> None:
    world = gang("development").given(health("degraded", at=30.0), health("healthy", 2000.0, "degraded"))
    n1 = world.state.nodes["n1"]
    assert n1.schedulable and n1.out_since is None and n1.degraded_at == (30.0,)
    world.given(health("failed", at=3000.0), NodeRecovered(node_id="n1", at=3001.0))
    assert not world.state.nodes["n1"].schedulable  # a silence verdict never undoes a hard fault
    world.given(NodeUndrained(node_id="n1", reason="GPU 3 replaced", undrained_by="ops", at=3100.0))
    n1 = world.state.nodes["n1"]
    assert n1.schedulable and n1.health == "healthy" and n1.health_evidence == ()


def test_a_restarted_agent_does_not_clear_its_nodes_health() -> None:
    world = gang("development").given(health("degraded", at=30.0))
    old = world.state.nodes["n1"]
    again = NodeRegistered(
        node_id="n1",
        address=old.address,
        rack=old.rack,
        gpu_type=old.gpu_type,
        gpus=old.gpus,
        cpu_milli=old.cpu_milli,
        memory_mib=old.memory_mib,
        agent_instance="agent-2",
        at=40.0,
    )
    world.given(again)
    assert world.state.nodes["n1"].health == "degraded" and not world.state.nodes["n1"].schedulable


def test_eviction_at_is_none_for_a_node_in_service() -> None:
    world = gang("best-effort")
    assert eviction_at(world.state.jobs["j1"], world.state.nodes["n1"], DEFAULT_DRAIN_POLICY) is None


@pytest.mark.parametrize("text", ["production", "production=later", "=now", "x=now,y"])
def test_a_bad_drain_policy_names_the_entry(text: str) -> None:
    with pytest.raises(ValueError, match="drain policy entry"):
        parse_drain_policy(text)


def test_a_drain_policy_sets_classes_and_the_default() -> None:
    policy = parse_drain_policy("production=finish, *=now")
    assert policy.action_for("production") == "finish" and policy.action_for("mystery") == "now"
    assert policy.action_for("training-high") == "checkpoint"
