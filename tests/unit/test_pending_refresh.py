"""Pending reasons as the scheduler appends them, without a cluster: a new code at once, new numbers at
most every REFRESH_S (the stalest first, REFRESH_PER_CYCLE a cycle), the policy's position kept by the fold
and agreeing with the message's "N jobs ahead", and a job that can never run rejected with the core's reason.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from rallypoint.audit import verify_decisions
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCancelled,
    JobCompleted,
    JobPending,
    JobRejected,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
)
from rallypoint.scheduling import SchedulingPolicy, decision_writes
from rallypoint.scheduling.pending import REFRESH_PER_CYCLE, REFRESH_S
from rallypoint.state import ClusterState

POLICY = SchedulingPolicy("rallypoint")


class Log:
    """A log being written: events get sequences and fold as they are appended."""

    def __init__(self, nodes: int = 1) -> None:
        self.records: list[tuple[int, Event]] = []
        self.state = ClusterState()
        self.now = 10.0
        self.append(LeaderEpochStarted(role="scheduler", epoch=1, leader_id="s1", at=1.0))
        self.append(*(node(f"n{i}") for i in range(nodes)))

    def append(self, *events: Event) -> None:
        for event in events:
            seq = len(self.records) + 1
            self.records.append((seq, event))
            self.state.apply(seq, event)

    def cycle(self, after: float = 1.0) -> list[Event]:
        """One scheduler cycle at epoch 1, ``after`` seconds after the last: its whole output, appended."""
        self.now += after
        decisions = POLICY.decide(self.state, self.now)
        writes = decision_writes(decisions, self.state, epoch=1, policy_version=POLICY.version, at=self.now)
        events = [w.event for w in writes]
        self.append(*events)
        return events


def node(node_id: str) -> NodeRegistered:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="r0",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def submit(job_id: str, at: float = 2.0, **spec: Any) -> JobSubmitted:
    fields: dict[str, Any] = {"name": job_id, "team": "t", "ranks_per_task": 1, "command": ("true",)}
    job = JobSpec(**({"gpus": 8, "gpus_per_task": 8} | fields | spec))
    return JobSubmitted(job_id=job_id, spec=job, submitted_at=at)


def of_type(events: list[Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_a_new_code_is_written_at_once_and_the_fold_keeps_the_position() -> None:
    log = Log()
    log.append(submit("runs"), submit("waits", at=3.0))
    events = log.cycle()
    assert [b.job_id for b in of_type(events, GangBound)] == ["runs"]
    [pending] = of_type(events, JobPending)
    assert (pending.job_id, pending.code, pending.position) == ("waits", "Resources", 0)
    job = log.state.jobs["waits"]
    assert (job.pending_position, job.pending_at) == (0, log.now)
    # nothing changed: nothing written
    assert log.cycle(after=REFRESH_S + 1) == []


def test_changed_numbers_wait_out_the_refresh_interval() -> None:
    log = Log()
    log.append(submit("big"), submit("first", at=3.0), submit("second", at=4.0, gpus=4, gpus_per_task=4))
    log.cycle()
    second = log.state.jobs["second"]
    assert (second.pending_code, second.pending_position) == ("Resources", 1)
    assert second.pending_message.endswith("; 1 job ahead")
    # "first" leaves the queue, so "second" is now 0 ahead, but its code is the same: not rewritten before
    # REFRESH_S has passed since its last reason
    log.append(JobCancelled(job_id="first", attempt=0, at=log.now))
    assert of_type(log.cycle(after=1.0), JobPending) == []
    assert log.state.jobs["second"].pending_position == 1
    [refreshed] = of_type(log.cycle(after=REFRESH_S), JobPending)
    assert (refreshed.job_id, refreshed.code, refreshed.position) == ("second", "Resources", 0)
    assert refreshed.message.endswith("; 0 jobs ahead")
    assert log.state.jobs["second"].pending_position == 0


def test_every_reason_position_agrees_with_its_jobs_ahead() -> None:
    log = Log()
    log.append(*(submit(f"j{i}", at=2.0 + i) for i in range(6)))
    events = of_type(log.cycle(), JobPending)
    assert len(events) == 5
    for event in events:
        ahead = re.search(r"; (\d+) jobs? ahead$", event.message)
        assert ahead is not None and int(ahead.group(1)) == event.position, event.message


def test_refreshes_per_cycle_are_capped_stalest_first() -> None:
    extra = 5
    log = Log(nodes=1)
    waiting = REFRESH_PER_CYCLE + extra
    log.append(submit("holder"), *(submit(f"w{i:04d}", at=3.0 + i) for i in range(waiting)))
    first = of_type(log.cycle(), JobPending)
    assert len(first) == waiting
    # the holder ends: every waiting job's numbers change ("8 free"), the first in line binds and the
    # others move up one position; code changes (none here but the bound one) are never capped
    log.append(JobCompleted(job_id="holder", attempt=1, at=log.now))
    events = log.cycle(after=REFRESH_S)
    assert [b.job_id for b in of_type(events, GangBound)] == ["w0000"]
    refreshed = [e.job_id for e in of_type(events, JobPending)]
    assert len(refreshed) == REFRESH_PER_CYCLE
    # equally stale (one cycle wrote them all): ties go by job id, so the last ids wait for the next cycle
    assert refreshed == sorted(refreshed) and refreshed[-1] == f"w{REFRESH_PER_CYCLE:04d}"
    rest = [e.job_id for e in of_type(log.cycle(after=1.0), JobPending)]
    assert rest == [f"w{i:04d}" for i in range(REFRESH_PER_CYCLE + 1, waiting)]


def test_a_task_larger_than_any_node_is_rejected_naming_it() -> None:
    log = Log(nodes=2)
    log.append(submit("wide", gpus=16, gpus_per_task=16))
    [rejected] = of_type(log.cycle(), JobRejected)
    assert rejected.reason == "can never run here: a task needs 16 GPUs; largest node has 8"
    assert rejected.field == "gpus_per_task"
    job = log.state.jobs["wide"]
    assert (job.state, job.reason) == ("rejected", rejected.reason)


def test_a_gpu_type_no_node_has_is_rejected_naming_it() -> None:
    log = Log()
    log.append(submit("typed", gpu_type="B200"), submit("fine", at=3.0))
    events = log.cycle()
    [rejected] = of_type(events, JobRejected)
    assert (rejected.job_id, rejected.field) == ("typed", "gpu_type")
    assert rejected.reason == "can never run here: no node has GPU type B200"
    assert [b.job_id for b in of_type(events, GangBound)] == ["fine"]


def test_every_reason_written_recomputes_and_a_forged_one_does_not() -> None:
    log = Log()
    log.append(submit("big"), submit("first", at=3.0), submit("second", at=4.0, gpus=4, gpus_per_task=4))
    log.cycle()
    log.append(JobCancelled(job_id="first", attempt=0, at=log.now))
    log.cycle(after=REFRESH_S)  # a refresh of "second"'s numbers
    report = verify_decisions(log.records, POLICY)
    assert report.ok, report
    assert report.reasons == report.reasons_verified == 3  # first, second, second refreshed
    # the same log with one reason's message changed after the fact: the audit names it
    seq, forged = next((s, e) for s, e in reversed(log.records) if isinstance(e, JobPending))
    records = [(s, e if s != seq else msgspec.structs.replace(forged, message="needs 4 GPUs; 99 free"))
               for s, e in log.records]  # fmt: skip
    report = verify_decisions(records, POLICY)
    assert not report.ok
    [mismatch] = report.mismatches
    assert (mismatch.seq, mismatch.kind, mismatch.job_id) == (seq, "JobPending", "second")
    assert mismatch.recorded == "Resources #0: needs 4 GPUs; 99 free"
    assert mismatch.recomputed == f"Resources #0: {forged.message}"
