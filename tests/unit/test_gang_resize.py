"""Elastic gangs live, without a cluster: the core's shrink becomes ``GangResized`` (a scheduler decision),
the job controller stops every rank and writes ``JobResized``, the fold frees only then the GPUs the shrink
drops, and the waiting job binds on them; completion waits for every bound rank; the audit recomputes it all.
"""

from __future__ import annotations

from typing import Any

from rallypoint.audit import verify_decisions
from rallypoint.cli import jobs_cmds
from rallypoint.control import Append, Kill, reconcile
from rallypoint.events import (
    Event,
    GangBound,
    GangResized,
    GpuInfo,
    JobCancelled,
    JobCompleted,
    JobResized,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    PreemptionRequested,
    RankExited,
    TaskPlacement,
)
from rallypoint.scheduling import SchedulingPolicy, decision_writes
from rallypoint.state import ClusterState

POLICY = SchedulingPolicy("rallypoint")


class Log:
    """A log being written: events get sequences and fold as they are appended."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Event]] = []
        self.state = ClusterState()
        self.now = 10.0

    def append(self, *events: Event) -> None:
        for event in events:
            seq = len(self.records) + 1
            self.records.append((seq, event))
            self.state.apply(seq, event)

    def cycle(self) -> list[Event]:
        """One scheduler cycle at epoch 1: the whole output, appended."""
        self.now += 1.0
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


def submit(job_id: str, priority: str, **spec: Any) -> JobSubmitted:
    fields: dict[str, Any] = {"name": job_id, "team": "t", "ranks_per_task": 1, "command": ("true",)}
    job = JobSpec(gpus=8, gpus_per_task=8, priority=priority, **(fields | spec))
    return JobSubmitted(job_id=job_id, spec=job, submitted_at=2.0)


def elastic_running(log: Log) -> None:
    """Two idle nodes: the elastic gang (8 GPUs, 8..16) binds all 16, as 2 tasks of 8, and runs."""
    log.append(LeaderEpochStarted(epoch=1, leader_id="s", at=1.0), node("a"), node("b"))
    log.append(submit("el", "best-effort", min_gpus=8, max_gpus=16))
    (bound,) = log.cycle()
    assert isinstance(bound, GangBound) and sum(len(p.gpus) for p in bound.placements) == 16
    log.append(JobStarted(job_id="el", attempt=1, at=log.now))


def exits(log: Log, job_id: str, ranks: range, code: int = 0) -> None:
    job = log.state.jobs[job_id]
    for rank in ranks:
        placement = job.placements[rank // job.spec.ranks_per_task]
        log.append(
            RankExited(
                job_id=job_id,
                attempt=job.attempt,
                rank=rank,
                node_id=placement.node_id,
                exit_code=code,
                at=log.now,
            )
        )


def test_an_elastic_gang_completes_only_after_every_bound_rank_exited() -> None:
    log = Log()
    elastic_running(log)
    job = log.state.jobs["el"]
    assert job.world_size == 2 and job.bound_gpus == 16
    exits(log, "el", range(1))
    assert reconcile(job, log.state, log.now) == []  # the spec's 8 GPUs ran one rank: not enough
    exits(log, "el", range(1, 2))
    (done,) = reconcile(job, log.state, log.now)
    assert isinstance(done, Append) and isinstance(done.event, JobCompleted)


def test_a_shrink_frees_gpus_only_after_the_ranks_stopped_then_the_waiting_job_starts() -> None:
    log = Log()
    elastic_running(log)
    log.append(submit("prod", "production"))
    written = log.cycle()
    (resize,) = [e for e in written if isinstance(e, GangResized)]
    assert not [e for e in written if isinstance(e, GangBound | PreemptionRequested)]
    assert resize.attempt == 2 and sum(len(p.gpus) for p in resize.placements) == 8
    assert [p.task for p in resize.placements] == [0]
    job = log.state.jobs["el"]
    assert job.resize is not None and job.state == "running"
    assert log.state.free_gpus() == 0  # nothing is freed while the ranks run

    # the next cycle asks nothing twice: no second resize, no bind onto GPUs still held
    assert [type(e) for e in log.cycle() if type(e).__name__ != "JobPending"] == []

    # the job controller stops every rank (SIGTERM, grace), then records the resize as done
    (kill,) = reconcile(job, log.state, log.now)
    assert isinstance(kill, Kill) and isinstance(kill.then, JobResized)
    assert kill.await_ranks == (0, 1) and kill.node_ids == ("a", "b")
    exits(log, "el", range(2), code=-15)
    log.append(kill.then)
    job = log.state.jobs["el"]
    assert (job.state, job.attempt, job.bound_gpus, job.world_size) == ("bound", 2, 8, 1)
    assert log.state.free_gpus() == 8 and job.resize is None

    # the production job binds on the freed GPUs; the shrunk gang relaunches at its new size
    (bound,) = [e for e in log.cycle() if isinstance(e, GangBound)]
    assert bound.job_id == "prod"
    freed = {p.node_id for p in bound.placements}
    assert freed.isdisjoint({p.node_id for p in job.placements})

    report = verify_decisions(log.records, POLICY)
    assert report.ok, report
    assert report.decisions == report.verified == 3  # two binds and the resize, recomputed bit for bit


def test_a_cancel_during_a_resize_frees_every_gpu() -> None:
    log = Log()
    elastic_running(log)
    log.append(submit("prod", "production"))
    log.cycle()
    log.append(JobCancelled(job_id="el", attempt=1, at=log.now))
    assert log.state.free_gpus() == 16  # prod took nothing yet: all of them are free again
    assert log.state.jobs["el"].resize is None


def test_a_stale_or_repeated_resize_changes_nothing() -> None:
    log = Log()
    elastic_running(log)
    log.append(submit("prod", "production"))
    (resize,) = [e for e in log.cycle() if isinstance(e, GangResized)]
    before = log.state.hash()
    log.append(resize)  # a repeat while it is under way
    assert log.state.hash() != before  # only the counters and sequence moved ...
    assert log.state.ignored_binds == 1 and log.state.jobs["el"].resize is not None
    stale = GangResized(**{**{f: getattr(resize, f) for f in resize.__struct_fields__}, "epoch": 0})
    log.append(stale)
    assert log.state.stale_decisions == 1
    # a JobResized for another attempt is ignored
    log.append(JobResized(job_id="el", attempt=7, at=log.now))
    assert log.state.jobs["el"].attempt == 1 and log.state.free_gpus() == 0


def test_rally_submit_takes_an_elastic_range() -> None:
    parser = jobs_cmds.argparse.ArgumentParser(prog="rally")
    jobs_cmds.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["submit", "--gpus", "8", "--min-gpus", "8", "--max-gpus", "16", "--", "t"])
    body = jobs_cmds.build_spec(args)
    assert (body["gpus"], body["min_gpus"], body["max_gpus"]) == (8, 8, 16)
    assert "gpu_step" not in body


def test_resized_tasks_are_numbered_from_zero() -> None:
    from rallypoint.core.types import Resize
    from rallypoint.scheduling import resized_placements

    gang = tuple(TaskPlacement(task=i, node_id=n, gpus=(0, 1)) for i, n in enumerate("abc"))
    shrunk = resized_placements(gang, Resize(job_id="j", gpus=4, remove=(gang[0],)))
    assert [(p.task, p.node_id) for p in shrunk] == [(0, "b"), (1, "c")]
