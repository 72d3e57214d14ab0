"""A cycle's binds as one message (``GangsBound``): written by the bridge, read as its binds by everyone.

A four-node cluster is driven through the twin's live side (the leader's cycle over the fold, as the live
scheduler runs it), with every appended event recorded as the log would store it. Then: a cycle that binds
several gangs wrote one ``GangsBound`` (one alone: its ``GangBound``); the fold of it equals the fold of the
same binds stored one by one; each service's change feed names every bound job; the audit recomputes and
counts each bind and refuses a forged one; a job's history, the projector's rows and the attempts show
each job's own bind.
"""

from __future__ import annotations

import msgspec

from rallypoint.audit import verify_decisions
from rallypoint.events import Event, GangBound, GangsBound, JobSpec, JobSubmitted, decode, encode, subjects
from rallypoint.jobs.history import job_history
from rallypoint.projection.rows import ReadModel
from rallypoint.runtime.changes import ChangeSet
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.writes import Write
from rallypoint.sim.cluster import Cluster, Node
from rallypoint.sim.twin import LiveSide
from rallypoint.state import ClusterState

T0 = 1_800_000_000.0


class RecordedSide(LiveSide):
    """The live side, keeping (seq, event) of everything appended, as the log stores it (encoded and
    decoded again, so nothing passes that the codec would not carry)."""

    history: list[tuple[int, Event]]

    def append(self, event: Event) -> None:
        if not hasattr(self, "history"):
            self.history = []
        stored = decode(encode(event))
        super().append(stored)
        self.history.append((self.seq, stored))


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, team="vision", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))


def side_with_jobs(jobs: int, nodes: int = 4) -> tuple[RecordedSide, list[Write]]:
    """``jobs`` one-node jobs submitted to ``nodes`` nodes, then one cycle: its writes, carried out."""
    cluster = Cluster(nodes=tuple(Node(id=f"n{i}", rack="r0", gpus=8) for i in range(nodes)))
    side = RecordedSide(cluster, SchedulingPolicy("fifo"))
    for i in range(jobs):
        side.append(JobSubmitted(job_id=f"j{i}", spec=spec(f"j{i}"), submitted_at=T0 + i))
    writes = side.cycle(T0 + 10).writes
    side.carry_out(writes, T0 + 10)
    return side, writes


def test_a_cycle_that_binds_several_gangs_writes_one_gangs_bound() -> None:
    _, writes = side_with_jobs(3)
    binds = [w for w in writes if isinstance(w.event, GangBound | GangsBound)]
    assert len(binds) == 1
    write = binds[0]
    assert isinstance(write.event, GangsBound)
    assert write.subject == subjects.BINDS == subjects.for_event(write.event)
    assert [b.job_id for b in write.event.binds] == ["j0", "j1", "j2"]
    assert write.msg_id == f"j0:1:GangsBound:e{write.event.binds[0].epoch}"


def test_a_cycle_that_binds_one_gang_writes_its_gang_bound_alone() -> None:
    _, writes = side_with_jobs(1)
    binds = [w.event for w in writes if isinstance(w.event, GangBound | GangsBound)]
    assert len(binds) == 1 and isinstance(binds[0], GangBound)
    assert subjects.members(binds[0]) == (binds[0],)


def test_the_fold_of_a_gangs_bound_equals_the_fold_of_its_binds_stored_one_by_one() -> None:
    side, _ = side_with_jobs(4)
    assert any(isinstance(event, GangsBound) for _, event in side.history)
    batched, apart = ClusterState(), ClusterState()
    seq = 0
    for at, event in side.history:
        batched.apply(at, event)
        for member in subjects.members(event):
            seq += 1
            apart.apply(seq, member)
    assert {j.job_id: j.state for j in batched.jobs.values()} == {f"j{i}": "running" for i in range(4)}
    assert msgspec.to_builtins(batched.nodes) == msgspec.to_builtins(apart.nodes)
    strip = {"last_seq", "bound_seq"}  # the sequences differ by construction, nothing else may
    for job_id, job in batched.jobs.items():
        mine = {k: v for k, v in msgspec.to_builtins(job).items() if k not in strip}
        theirs = {k: v for k, v in msgspec.to_builtins(apart.jobs[job_id]).items() if k not in strip}
        assert mine == theirs


def test_every_bound_job_reaches_each_change_feed() -> None:
    side, _ = side_with_jobs(3)
    assert sum(isinstance(event, GangsBound) for _, event in side.history) == 1
    state, changes = ClusterState(), ChangeSet()
    for seq, event in side.history:
        if isinstance(event, GangsBound):
            changes.take()  # what came before
            changes.add(state.apply(seq, event))
            taken = changes.take()
            assert set(taken.jobs) == {"j0", "j1", "j2"}
            assert set(taken.nodes) == {"n0", "n1", "n2"}
        else:
            changes.add(state.apply(seq, event))


def test_the_audit_recomputes_each_bind_of_a_gangs_bound() -> None:
    side, _ = side_with_jobs(3)
    assert any(isinstance(event, GangsBound) for _, event in side.history)
    report = verify_decisions(side.history, SchedulingPolicy("fifo"))
    assert report.ok, report
    assert report.decisions == report.verified == 3


def test_the_audit_refuses_a_forged_bind_inside_a_gangs_bound() -> None:
    side, _ = side_with_jobs(2)
    history = list(side.history)
    at, batch = next((i, e) for i, (_, e) in enumerate(history) if isinstance(e, GangsBound))
    seq = history[at][0]
    forged = msgspec.structs.replace(batch.binds[1], epoch=99)
    history[at] = (seq, GangsBound(binds=(batch.binds[0], forged)))
    report = verify_decisions(history, SchedulingPolicy("fifo"))
    assert not report.ok
    assert [(r.seq, r.job_id, r.refusal) for r in report.refused] == [(seq, "j1", "epoch")]
    assert report.tallies["decisions"].total == 2 and report.tallies["decisions"].refused == 1


def test_a_jobs_history_rows_and_attempts_show_its_own_bind() -> None:
    side, _ = side_with_jobs(3)
    assert any(isinstance(event, GangsBound) for _, event in side.history)
    history = job_history(side.history, "j1")
    assert history is not None
    bound = [entry for entry in history.timeline if entry.type == "GangBound.v1"]
    assert len(bound) == 1 and bound[0].applied
    model = ReadModel()
    for seq, event in side.history:
        model.apply(seq, event)
    assert {job_id: model.state.jobs[job_id].state for job_id in ("j0", "j1", "j2")} == dict.fromkeys(
        ("j0", "j1", "j2"), "running"
    )
    assert [a.attempt for a in model.attempts.of("j2")] == [1]
