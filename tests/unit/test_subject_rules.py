"""Every event has one subject it may be stored on; anywhere else the codec quarantines it as misplaced.

NATS permissions decide who may publish on which subject (rallypoint.security); these rules tie each
event type to a subject, so together they decide who may write which event. A forged event that lands
anyway (an old server config, a test server without permissions) changes no fold, and every fold skips it
the same way, so state hashes still agree.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from rallypoint.events import (
    ALL_EVENT_TYPES,
    CheckpointCommitted,
    CheckpointVerified,
    Event,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeDrained,
    NodeLost,
    NodeRegistered,
    NodeUndrained,
    PreemptionRequested,
    RankExited,
    encode,
    subjects,
)
from rallypoint.events.codec import Quarantined, decode_stored
from rallypoint.state import ClusterState

SPEC = JobSpec(name="p", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))


def submitted(job_id: str = "j1") -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=SPEC, submitted_at=1.0)


def rank_exit(node_id: str = "n1", job_id: str = "j1") -> RankExited:
    return RankExited(job_id=job_id, attempt=1, rank=0, node_id=node_id, exit_code=0, at=2.0)


def registration(node_id: str = "n1") -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id, address="a", rack="r", gpu_type="g", gpus=(), cpu_milli=1, memory_mib=1,
        agent_instance="i", at=1.0,
    )  # fmt: skip


def commit(node_id: str = "n1") -> CheckpointCommitted:
    return CheckpointCommitted(
        job_id="j1",
        attempt=1,
        step=10,
        path="/c/10",
        manifest_sha256="0" * 64,
        bytes=1,
        shards=1,
        save_s=0.1,
        node_id=node_id,
        at=3.0,
    )


def preemption_request(role: Literal["scheduler", "preemption"]) -> PreemptionRequested:
    return PreemptionRequested(
        job_id="j1",
        role=role,
        attempt=1,
        for_job="j2",
        reason="priority",
        epoch=1,
        computed_at_seq=1,
        policy_version="p",
        now=1.0,
        at=1.0,
    )


def test_an_old_preemption_request_reads_as_the_preemption_services() -> None:
    """Recorded before the scheduler wrote them: no ``role`` field, judged by the preemption epoch."""
    old = msgspec.json.decode(encode(preemption_request("preemption")))
    del old["role"]
    event = decode_stored(msgspec.json.encode(old), seq=1, subject="rally.preempt.request.j1")
    assert isinstance(event, PreemptionRequested) and event.role == "preemption"


def test_every_event_type_has_a_subject() -> None:
    assert set(subjects._SUBJECT_OF) == set(ALL_EVENT_TYPES)


@pytest.mark.parametrize(
    ("event", "subject"),
    [
        (submitted(), "rally.job.j1"),
        (JobStarted(job_id="j1", attempt=1, at=1.0), "rally.ctl.job.j1"),
        (JobCompleted(job_id="j1", attempt=1, at=1.0), "rally.ctl.job.j1"),
        (rank_exit(), "rally.agent.n1.job.j1"),
        (commit(), "rally.agent.n1.ckpt.j1"),
        (NodeLost(node_id="n1", reason="x", at=1.0), "rally.node.n1.health"),
        (NodeDrained(node_id="n1", reason="x", at=1.0), "rally.node.n1.health"),
        (NodeDrained(node_id="n1", reason="x", at=1.0, drained_by="alice"), "rally.node.n1.op"),
        (NodeUndrained(node_id="n1", reason="x", undrained_by="alice", at=1.0), "rally.node.n1.op"),
        (registration(), "rally.node.n1.agent"),
        (LeaderEpochStarted(epoch=1, leader_id="a", at=1.0), "rally.sched.epoch"),
        (LeaderEpochStarted(epoch=1, leader_id="a", role="preemption", at=1.0), "rally.preempt.epoch"),
        # a job-controller partition's new owner fences the old one on the partition's own epoch subject
        (LeaderEpochStarted(epoch=1, leader_id="a", role="job-controller.7", at=1.0), "rally.ctl.epoch.7"),
        # a health-monitor partition's: under the nodes' tree its fold reads, five tokens (no node's own)
        (
            LeaderEpochStarted(epoch=1, leader_id="a", role="health-monitor.7", at=1.0),
            "rally.node.partition.7.epoch",
        ),
        # a checkpoint partition's: under rally.ckpt, four tokens (a job's own subject there has three)
        (LeaderEpochStarted(epoch=1, leader_id="a", role="checkpoint.7", at=1.0), "rally.ckpt.epoch.7"),
        # a job named "epoch" keeps its own three-token subject
        (CheckpointVerified(job_id="epoch", step=1, ok=True, at=1.0), "rally.ckpt.epoch"),
        # the scheduler's preemption requests are on its fenced tree; the old service's stay readable
        (preemption_request("scheduler"), "rally.sched.preempt.j1"),
        (preemption_request("preemption"), "rally.preempt.request.j1"),
    ],
)
def test_the_subject_of_an_event(event: Event, subject: str) -> None:
    assert subjects.for_event(event) == subject
    assert decode_stored(encode(event), seq=1, subject=subject) == event


@pytest.mark.parametrize(
    ("event", "subject"),
    [
        # the API's subject cannot carry what the job controller decides
        (JobCompleted(job_id="j1", attempt=1, at=1.0), "rally.job.j1"),
        # nor another job's subject
        (submitted("j1"), "rally.job.j2"),
        # an agent speaks only for its own node: not on another node's subject ...
        (rank_exit("n2"), "rally.agent.n1.job.j1"),
        # ... nor in its own subject tree with another node's id
        (commit("n2"), "rally.agent.n1.ckpt.j1"),
        (NodeLost(node_id="n2", reason="x", at=1.0), "rally.agent.n1.job.j1"),
        # a node agent cannot judge its own node, the API cannot pose as the health monitor ...
        (NodeLost(node_id="n1", reason="x", at=1.0), "rally.node.n1.agent"),
        (NodeLost(node_id="n1", reason="x", at=1.0), "rally.node.n1.op"),
        (NodeDrained(node_id="n1", reason="x", at=1.0), "rally.node.n1.op"),
        # ... nor an operator's drain be written on the monitor's subject, nor a registration anywhere else
        (NodeDrained(node_id="n1", reason="x", at=1.0, drained_by="alice"), "rally.node.n1.health"),
        (registration(), "rally.node.n1.health"),
        (registration(), "rally.node.n1"),
        # the old subjects of agent events
        (rank_exit(), "rally.job.j1"),
        (commit(), "rally.ckpt.j1"),
        # a request may not claim the other role's tree (its epoch is judged by the role it names)
        (preemption_request("preemption"), "rally.sched.preempt.j1"),
        (preemption_request("scheduler"), "rally.preempt.request.j1"),
        # a checkpoint partition's epoch is on its own partition's subject, never another's or a job's
        (LeaderEpochStarted(epoch=1, leader_id="a", role="checkpoint.7", at=1.0), "rally.ckpt.epoch.8"),
        (LeaderEpochStarted(epoch=1, leader_id="a", role="checkpoint.7", at=1.0), "rally.ckpt.j1"),
        # nor a verification on an epoch subject
        (CheckpointVerified(job_id="j1", step=1, ok=True, at=1.0), "rally.ckpt.epoch.7"),
        # an epoch of a role nobody fences
        (LeaderEpochStarted(epoch=1, leader_id="a", role="rogue", at=1.0), "rally.sched.epoch"),
        # ids that form no subject
        (rank_exit("n1.job.x"), "rally.agent.n1.job.x.job.j1"),
    ],
)
def test_an_event_elsewhere_is_quarantined_as_misplaced(event: Event, subject: str) -> None:
    record = decode_stored(encode(event), seq=5, subject=subject)
    assert isinstance(record, Quarantined)
    assert (record.seq, record.subject, record.reason) == (5, subject, "misplaced")


def test_an_unknown_subject_is_not_checked() -> None:
    # An exported history stores events without subjects; what the live fold quarantined it keeps as such.
    event = JobCompleted(job_id="j1", attempt=1, at=1.0)
    assert decode_stored(encode(event), seq=1, subject="") == event


def test_a_forged_completion_changes_no_fold_and_every_fold_agrees() -> None:
    """The API (rally.job.>) forges JobCompleted: every fold skips it the same way and counts it."""
    stored = [
        ("rally.job.j1", submitted()),
        ("rally.job.j1", JobCompleted(job_id="j1", attempt=1, at=2.0)),
    ]

    def fold() -> ClusterState:
        state = ClusterState()
        for seq, (subject, event) in enumerate(stored, start=1):
            state.apply_stored(seq, decode_stored(encode(event), seq=seq, subject=subject))
        return state

    one, two = fold(), fold()
    assert one.jobs["j1"].state == "pending"
    assert one.quarantine.by_reason == {"misplaced": 1}
    assert one.last_seq == 2
    assert one.hash() == two.hash()


@pytest.mark.parametrize(
    "role",
    [
        "job-controller.32",
        "job-controller.07",
        "job-controller.-1",
        "ctl.3",
        "x",
        "health-monitor.32",
        "health-monitor.07",
        "health-monitor",
        "checkpoint.32",
        "checkpoint.07",
        "checkpoint",
    ],
)
def test_no_epoch_subject_for_a_role_that_is_not_a_single_writer(role: str) -> None:
    with pytest.raises(ValueError):
        subjects.epoch(role)


def test_a_key_stays_in_its_partition() -> None:
    # crc32, not hash(): every process and release agrees (a job's partition never moves)
    assert subjects.partition_of("job-1", subjects.CONTROL_PARTITIONS) == 1279408703 % 32
    assert {subjects.partition_of(f"j{i}", 32) for i in range(1000)} == set(range(32))
