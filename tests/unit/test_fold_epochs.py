"""Given/when/then: only the current epoch's decisions count, and a bind must keep the job's spec.

Given a log (leaders, nodes, jobs), when a decision arrives, then the fold applies it or refuses it; a refused
decision changes nothing but its counter, and the audit (``verify_decisions``) fails on it and lists it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from rallypoint.audit import verify_decisions
from rallypoint.events import (
    Event,
    GangBound,
    GangRepaired,
    GpuInfo,
    JobCancelRequested,
    JobInterrupted,
    JobPending,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeLost,
    NodeRegistered,
    PreemptionRequested,
    TaskPlacement,
    decode,
    encode,
)
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState, Decision, decision_refusal

EIGHT = tuple(range(8))


def node(node_id: str, gpu_type: str = "H100", rack: str = "r0") -> NodeRegistered:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(8)
    )
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack=rack,
        gpu_type=gpu_type,
        gpus=gpus,
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def submit(job_id: str, gpus: int = 8, per_task: int = 8, **spec: Any) -> JobSubmitted:
    fields: dict[str, Any] = {"name": job_id, "team": "t", "ranks_per_task": 1, "command": ("true",)}
    job = JobSpec(gpus=gpus, gpus_per_task=per_task, **(fields | spec))
    return JobSubmitted(job_id=job_id, spec=job, submitted_at=2.0)


def epoch(number: int, role: str = "scheduler") -> LeaderEpochStarted:
    return LeaderEpochStarted(epoch=number, leader_id=f"{role}-{number}", role=role, at=float(number))


def bind(job_id: str, *tasks: tuple[str, tuple[int, ...]], epoch: int = 1, attempt: int = 1) -> GangBound:
    placements = tuple(TaskPlacement(task=i, node_id=n, gpus=g) for i, (n, g) in enumerate(tasks))
    return GangBound(
        job_id=job_id,
        attempt=attempt,
        epoch=epoch,
        placements=placements,
        computed_at_seq=0,
        policy_version="test",
        now=3.0,
        at=3.0,
    )


def pending(job_id: str, epoch: int) -> JobPending:
    return JobPending(job_id=job_id, code="Resources", message="m", epoch=epoch, computed_at_seq=0, at=3.0)


def preempt(job_id: str, epoch: int, role: str = "preemption") -> PreemptionRequested:
    """``role`` "preemption": a request as the old preemption service recorded it (no role field)."""
    return PreemptionRequested(
        job_id=job_id,
        role="scheduler" if role == "scheduler" else "preemption",
        attempt=1,
        for_job="x",
        reason="priority",
        epoch=epoch,
        computed_at_seq=0,
        policy_version="test",
        now=5.0,
        at=5.0,
    )


def repair(job_id: str, *tasks: tuple[int, str, tuple[int, ...]], epoch: int) -> GangRepaired:
    placements = tuple(TaskPlacement(task=t, node_id=n, gpus=g) for t, n, g in tasks)
    return GangRepaired(
        job_id=job_id,
        attempt=2,
        epoch=epoch,
        placements=placements,
        computed_at_seq=0,
        policy_version="test",
        now=9.0,
        at=9.0,
    )


def requeue(job_id: str, epoch: int) -> JobRequeued:
    return JobRequeued(job_id=job_id, attempt=1, reason="r", epoch=epoch, computed_at_seq=0, now=9.0, at=9.0)


def fold(events: list[Event]) -> ClusterState:
    state = ClusterState()
    for seq, event in enumerate(events, start=1):
        state.apply(seq, decode(encode(event)))  # the wire format, as the services fold it
    return state


def interrupted_gang(scheduler_epoch: int) -> list[Event]:
    """j: 16 GPUs on a and b (both H100), running; b lost; the gang is repairing on a. c is free."""
    return [
        epoch(1),
        node("a"),
        node("b"),
        node("c"),
        submit("j", 16),
        bind("j", ("a", EIGHT), ("b", EIGHT)),
        JobStarted(job_id="j", attempt=1, at=4.0),
        NodeLost(node_id="b", reason="x", at=5.0),
        JobInterrupted(job_id="j", attempt=1, failed_nodes=("b",), reason="x", at=6.0),
        *([epoch(scheduler_epoch)] if scheduler_epoch > 1 else []),
    ]


# --- the epoch rule ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochCase:
    name: str
    given: list[Event]
    when: Decision
    applies: bool


RUNNING = [epoch(1), epoch(1, "preemption"), node("a"), submit("j"), bind("j", ("a", EIGHT))]

EPOCH_CASES = [
    EpochCase(
        "a bind of the current epoch applies",
        [epoch(2), node("a"), submit("j")],
        bind("j", ("a", EIGHT), epoch=2),
        True,
    ),
    EpochCase(
        "a forged bind with epoch 0 changes nothing",
        [epoch(2), node("a"), submit("j")],
        bind("j", ("a", EIGHT), epoch=0),
        False,
    ),
    EpochCase(
        "a deposed leader's bind changes nothing",
        [epoch(1), epoch(2), node("a"), submit("j")],
        bind("j", ("a", EIGHT), epoch=1),
        False,
    ),
    EpochCase(
        "a bind from a future epoch changes nothing",
        [epoch(2), node("a"), submit("j")],
        bind("j", ("a", EIGHT), epoch=3),
        False,
    ),
    EpochCase(
        "before any leader even epoch 0 changes nothing",
        [node("a"), submit("j")],
        bind("j", ("a", EIGHT), epoch=0),
        False,
    ),
    EpochCase(
        "a pending reason of the current epoch applies", [epoch(2), submit("j")], pending("j", 2), True
    ),
    EpochCase("a stale pending reason changes nothing", [epoch(2), submit("j")], pending("j", 1), False),
    EpochCase(
        "a preemption request of the preemption leader's epoch applies", RUNNING, preempt("j", 1), True
    ),
    EpochCase(
        "a preemption request of another epoch changes nothing",
        [*RUNNING, epoch(2, "preemption")],
        preempt("j", 1),
        False,
    ),
    EpochCase(
        "the scheduler's epoch does not make a preemption request count",
        [RUNNING[0], *RUNNING[2:]],
        preempt("j", 1),
        False,
    ),
    EpochCase(
        "the scheduler's preemption request of its current epoch applies",
        [epoch(2), node("a"), submit("j"), bind("j", ("a", EIGHT), epoch=2)],
        preempt("j", 2, "scheduler"),
        True,
    ),
    EpochCase(
        "a deposed scheduler's preemption request changes nothing",
        [epoch(1), node("a"), submit("j"), bind("j", ("a", EIGHT)), epoch(2)],
        preempt("j", 1, "scheduler"),
        False,
    ),
    EpochCase(
        "a preemption leader's epoch does not make the scheduler's request count",
        [epoch(1), node("a"), submit("j"), bind("j", ("a", EIGHT)), epoch(2, "preemption")],
        preempt("j", 2, "scheduler"),
        False,
    ),
    EpochCase(
        "a repair of the current epoch applies",
        interrupted_gang(3),
        repair("j", (0, "a", EIGHT), (1, "c", EIGHT), epoch=3),
        True,
    ),
    EpochCase(
        "a stale repair changes nothing",
        interrupted_gang(3),
        repair("j", (0, "a", EIGHT), (1, "c", EIGHT), epoch=2),
        False,
    ),
    EpochCase("a requeue of the current epoch applies", interrupted_gang(3), requeue("j", 3), True),
    EpochCase("a stale requeue changes nothing", interrupted_gang(3), requeue("j", 1), False),
]


@pytest.mark.parametrize("case", EPOCH_CASES, ids=lambda c: c.name)
def test_only_the_current_epochs_decisions_count(case: EpochCase) -> None:
    before = fold(case.given)
    after = fold([*case.given, case.when])
    refusal = decision_refusal(before, case.when)
    if case.applies:
        assert refusal is None and after.stale_decisions == 0
        assert after.jobs["j"] != before.jobs["j"]
    else:
        assert refusal is not None and refusal.kind == "epoch"
        assert after.stale_decisions == 1
        assert_unchanged(before, after)


def assert_unchanged(before: ClusterState, after: ClusterState) -> None:
    """Everything but the counters and the position is as it was."""
    counters = {"last_seq", "stale_decisions", "ignored_binds"}
    fields = [f for f in msgspec.structs.fields(ClusterState) if f.name not in counters]
    for field in fields:
        assert getattr(after, field.name) == getattr(before, field.name), field.name


# --- a bind must keep the job's spec -----------------------------------------------------------------


@dataclass(frozen=True)
class SpecCase:
    name: str
    job: JobSubmitted
    when: GangBound
    why: str  # "" when it applies; else a fragment of the refusal's reason


NODES = [node("h1"), node("h2"), node("h3"), node("a1", gpu_type="A100"), node("l1", gpu_type="L40")]
FOUR = (0, 1, 2, 3)

SPEC_CASES = [
    SpecCase(
        "a job needing fake-gpu is never bound on an H100",
        submit("j", gpu_type="fake-gpu"),
        bind("j", ("h1", EIGHT)),
        "GPU type H100",
    ),
    SpecCase(
        "a job needing H100 binds on an H100", submit("j", gpu_type="H100"), bind("j", ("h1", EIGHT)), ""
    ),
    SpecCase(
        "a type from the job's list binds",
        submit("j", gpu_types=("L40", "A100")),
        bind("j", ("a1", EIGHT)),
        "",
    ),
    SpecCase(
        "a type outside the job's list does not",
        submit("j", gpu_types=("L40", "A100")),
        bind("j", ("h1", EIGHT)),
        "needs L40, A100",
    ),
    SpecCase(
        "a job of any type still binds on one type",
        submit("j", 16),
        bind("j", ("h1", EIGHT), ("a1", EIGHT)),
        "A100, H100",
    ),
    SpecCase(
        "a gang smaller than the spec is refused",
        submit("j", 16),
        bind("j", ("h1", EIGHT)),
        "8 GPUs, the job takes 16..16",
    ),
    SpecCase(
        "a gang larger than the spec is refused",
        submit("j", 8),
        bind("j", ("h1", EIGHT), ("h2", EIGHT)),
        "16 GPUs",
    ),
    SpecCase(
        "a task must have gpus_per_task GPUs",
        submit("j", 8, per_task=4),
        bind("j", ("h1", FOUR), ("h2", EIGHT)),
        "task 1 has 8 GPUs, not 4",
    ),
    SpecCase(
        "an elastic gang binds inside its range",
        submit("j", 16, min_gpus=8, max_gpus=24),
        bind("j", ("h1", EIGHT)),
        "",
    ),
    SpecCase(
        "an elastic gang binds at its top",
        submit("j", 16, min_gpus=8, max_gpus=24),
        bind("j", ("h1", EIGHT), ("h2", EIGHT), ("h3", EIGHT)),
        "",
    ),
    SpecCase(
        "an elastic gang does not bind below its range",
        submit("j", 16, per_task=4, min_gpus=8),
        bind("j", ("h1", FOUR)),
        "4 GPUs, the job takes 8..16",
    ),
    SpecCase(
        "a GPU named twice is refused",
        submit("j", 16),
        bind("j", ("h1", EIGHT), ("h1", EIGHT)),
        "named twice",
    ),
    SpecCase(
        "a GPU the node does not have is refused",
        submit("j", 1, per_task=1),
        bind("j", ("h1", (9,))),
        "does not exist",
    ),
    SpecCase("an unknown node is refused", submit("j", 8), bind("j", ("nowhere", EIGHT)), "no node nowhere"),
    SpecCase(
        "an attempt that skips one is refused",
        submit("j", 8),
        bind("j", ("h1", EIGHT), attempt=3),
        "attempt 3 after attempt 0",
    ),
]


@pytest.mark.parametrize("case", SPEC_CASES, ids=lambda c: c.name)
def test_a_bind_must_keep_the_jobs_spec(case: SpecCase) -> None:
    given = [epoch(1), *NODES, case.job]
    before = fold(given)
    after = fold([*given, case.when])
    refusal = decision_refusal(before, case.when)
    if not case.why:
        assert refusal is None and after.jobs["j"].state == "bound"
        return
    assert refusal is not None and refusal.kind == "invalid" and case.why in refusal.why, refusal
    assert after.ignored_binds == 1 and after.jobs["j"].state == "pending"
    assert_unchanged(before, after)


def test_a_repair_onto_another_gpu_type_is_refused() -> None:
    given = [*interrupted_gang(1)[:3], node("c", gpu_type="A100"), *interrupted_gang(1)[4:]]
    before = fold(given)
    forged = repair("j", (0, "a", EIGHT), (1, "c", EIGHT), epoch=1)
    refusal = decision_refusal(before, forged)
    assert refusal is not None and refusal.kind == "invalid" and "A100, H100" in refusal.why
    after = fold([*given, forged])
    assert after.jobs["j"].state == "repairing" and after.ignored_binds == 1


def test_a_shrunk_elastic_repair_within_its_range_applies() -> None:
    given = [*interrupted_gang(1)[:4], submit("j", 16, min_gpus=8), *interrupted_gang(1)[5:]]
    shrunk = repair("j", (0, "a", EIGHT), epoch=1)
    after = fold([*given, shrunk])
    assert after.jobs["j"].state == "bound" and after.jobs["j"].bound_gpus == 8


def test_a_bind_for_a_job_cancelled_meanwhile_is_overtaken_not_invalid() -> None:
    given = [epoch(1), node("h1"), submit("j"), JobCancelRequested(job_id="j", at=2.5)]
    refusal = decision_refusal(fold(given), bind("j", ("h1", EIGHT)))
    assert refusal is not None and refusal.kind == "overtaken"


# --- the audit -----------------------------------------------------------------------------------------


def numbered(events: list[Event]) -> list[tuple[int, Event]]:
    return list(enumerate(events, start=1))


def test_the_audit_fails_on_a_forged_or_stale_decision_and_lists_it() -> None:
    history = numbered(
        [
            epoch(1),
            epoch(2),
            node("h1"),
            submit("j", gpu_type="fake-gpu"),
            bind("j", ("h1", EIGHT), epoch=0),
            bind("j", ("h1", EIGHT), epoch=1),
            bind("j", ("h1", EIGHT), epoch=2),
            pending("j", 1),
        ]
    )
    report = verify_decisions(history, SchedulingPolicy("rallypoint"), allow_other_policies=True)
    assert not report.ok
    assert [(r.seq, r.kind, r.refusal) for r in report.refused] == [
        (5, "GangBound", "epoch"),
        (6, "GangBound", "epoch"),
        (7, "GangBound", "invalid"),
        (8, "JobPending", "epoch"),
    ]
    assert "GPU type H100 on a job that needs fake-gpu" in report.refused[2].why
    assert report.mismatches == [] and report.verified == 0  # refused ones are not also mismatches


def test_the_audit_lists_an_overtaken_decision_and_still_recomputes_it() -> None:
    history = numbered(
        [epoch(1), node("h1"), submit("j"), JobCancelRequested(job_id="j", at=2.5), pending("j", 1)]
    )
    history.append(
        (6, JobRequeued(job_id="j", attempt=0, reason="r", epoch=1, computed_at_seq=0, now=1.0, at=1.0))
    )
    report = verify_decisions(history, SchedulingPolicy("rallypoint"))
    assert report.refused == []
    assert [(r.seq, r.refusal) for r in report.overtaken] == [(6, "overtaken")]
    # no gang was interrupted at seq 0, so no scheduler requeued one: this requeue was made up, and fails
    # the audit (test_audit_repairs: one the scheduler did make, overtaken by a cancel, passes)
    assert not report.ok and [(m.seq, m.recomputed) for m in report.mismatches] == [(6, "no repair")]


def test_decisions_under_another_policy_fail_the_audit_unless_allowed() -> None:
    history = numbered([epoch(1), node("h1"), submit("j"), bind("j", ("h1", EIGHT))])
    strict = verify_decisions(history, SchedulingPolicy("rallypoint"))
    assert not strict.ok and strict.other_policy_seqs == [4] and strict.refused == []
    assert verify_decisions(history, SchedulingPolicy("rallypoint"), allow_other_policies=True).ok
