"""The fold's reader index answers exactly what a scan of every job and node answers, after every event of
random histories, and it stays outside the hash and the snapshots."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.events import (
    Dependency,
    Event,
    GangBound,
    GangRepaired,
    GpuInfo,
    JobAttemptFailed,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobInterrupted,
    JobPreempted,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeDrained,
    NodeHeartbeatLost,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.state import ClusterState, JobView, Touched
from rallypoint.state.dependencies import hold_message
from rallypoint.state.indexes import UNSETTLED_LIMIT

DEPENDENCY_KINDS = ("after", "after-ok", "after-not-ok", "after-any")

NODES = tuple(f"n{i}" for i in range(6))


# --- brute force: the readers as they were, a scan and a sort ------------------------------------


def scan_pending(state: ClusterState) -> list[JobView]:
    waiting = [j for j in state.jobs.values() if j.state == "pending" and not j.cancel_requested]
    return sorted(waiting, key=lambda j: j.submitted_seq)


def scan_repairing(state: ClusterState) -> list[JobView]:
    waiting = [j for j in state.jobs.values() if j.state == "repairing" and not j.cancel_requested]
    return sorted(waiting, key=lambda j: j.submitted_seq)


def scan_growable(state: ClusterState) -> list[JobView]:
    growable = [
        j
        for j in state.jobs.values()
        if j.state in ("bound", "running")
        and not j.cancel_requested
        and j.spec.max_gpus is not None
        and j.bound_gpus < j.spec.max_gpus
    ]
    return sorted(growable, key=lambda j: j.submitted_seq)


def scan_totals(state: ClusterState) -> tuple[int, int, int, int | None]:
    nodes = state.nodes.values()
    return (
        sum(n.gpu_count for n in nodes),
        sum(n.gpu_count for n in nodes if n.schedulable),
        sum(len(n.gpus) - len(n.allocated) for n in nodes if n.schedulable),
        max((n.gpu_count for n in nodes), default=None),
    )


def indexed_totals(state: ClusterState) -> tuple[int, int, int, int | None]:
    return (
        state.total_gpus(),
        state.total_gpus(schedulable_only=True),
        state.free_gpus(),
        state.largest_node_gpus(),
    )


def scan_held(state: ClusterState) -> dict[str, str]:
    """Pending jobs a dependency or an earlier live job of the same name and team holds, by a scan."""
    held: dict[str, str] = {}
    for job in scan_pending(state):
        earlier = sorted(
            (j.submitted_seq, j.job_id)
            for j in state.jobs.values()
            if not j.terminal
            and (j.spec.team, j.spec.name) == (job.spec.team, job.spec.name)
            and j.submitted_seq < job.submitted_seq
        )
        why = hold_message(job, state.jobs, [job_id for _seq, job_id in earlier])
        if why is not None and (job.spec.depends_on or job.spec.singleton):
            held[job.job_id] = why
    return held


def assert_index_agrees(state: ClusterState, now: float) -> None:
    assert state.pending_jobs() == scan_pending(state)
    assert state.repairing_jobs() == scan_repairing(state)
    assert state.growable_jobs() == scan_growable(state)
    held = scan_held(state)
    ready = [
        j for j in scan_pending(state) if (j.retry_at is None or j.retry_at <= now) and j.job_id not in held
    ]
    assert state.ready_jobs(now) == ready
    assert state.held_jobs() == held
    for job_id in state.jobs:
        waiting = {
            j.job_id for j in scan_pending(state) if any(d.job_id == job_id for d in j.spec.depends_on)
        }
        assert state.dependents_of(job_id) == waiting
    assert indexed_totals(state) == scan_totals(state)
    waiting = Counter(j.spec.team for j in scan_pending(state))
    assert {team: state.pending_count(team) for team in {*waiting, "nobody"}} == {**waiting, "nobody": 0}


# --- random histories, drawn against the state so that most decisions apply ------------------------


def registered(rng: random.Random, node_id: str) -> NodeRegistered:
    gpus = rng.choice((4, 8))
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack=f"r{int(node_id[1:]) % 2}",
        gpu_type="sim",
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(gpus)
        ),
        cpu_milli=1,
        memory_mib=1,
        agent_instance=f"a{rng.randrange(3)}",
        at=1.0,
    )


def submitted(job_id: str, gpus: int) -> JobSubmitted:
    # every third job elastic up to twice its size: bound, it is growable (no extra draw from the rng)
    most = 2 * gpus if int(job_id[1:]) % 3 == 0 else None
    n = int(job_id[1:])
    # some jobs wait on the one before (each kind in turn), some share a name, one in two as a singleton
    kind = DEPENDENCY_KINDS[n // 4 % len(DEPENDENCY_KINDS)]
    depends_on = (Dependency(kind=kind, job_id=f"j{n - 1}"),) if n % 4 == 1 else ()
    spec = JobSpec(
        name="shared" if n % 5 in (2, 3) else job_id,
        singleton=n % 5 == 2,
        depends_on=depends_on,
        team=f"t{int(job_id[1:]) % 3}",  # three teams: the index counts pending jobs by team
        gpus=gpus,
        gpus_per_task=gpus,
        ranks_per_task=1,
        command=("x",),
        min_gpus=gpus if most else None,
        max_gpus=most,
        gpu_step=gpus if most else None,
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)


def placement(rng: random.Random, state: ClusterState, gpus: int) -> tuple[TaskPlacement, ...]:
    """One task on a random node, usually on free GPUs (sometimes not: the fold must refuse it)."""
    node = state.nodes[rng.choice(sorted(state.nodes))]
    free = [g.index for g in node.gpus if g.index not in node.allocated or rng.random() < 0.1]
    chosen = tuple(sorted(rng.sample(free, gpus))) if len(free) >= gpus else tuple(range(gpus))
    return (TaskPlacement(task=0, node_id=node.node_id, gpus=chosen),)


def job_event(rng: random.Random, state: ClusterState, job: JobView, now: float) -> Event:
    j, a = job.job_id, job.attempt
    if job.state == "pending" and state.nodes and rng.random() < 0.7:
        places = placement(rng, state, job.spec.gpus)
        return GangBound(
            job_id=j,
            attempt=a + 1,
            epoch=1,
            placements=places,
            computed_at_seq=0,
            policy_version="p",
            now=now,
            at=now,
        )
    if job.state == "repairing" and state.nodes and rng.random() < 0.5:
        places = placement(rng, state, job.spec.gpus)
        return GangRepaired(
            job_id=j,
            attempt=a + 1,
            epoch=1,
            placements=places,
            computed_at_seq=0,
            policy_version="p",
            now=now,
            at=now,
        )
    failed = tuple(p.node_id for p in job.placements)
    choices: list[Event] = [
        JobStarted(job_id=j, attempt=a, resume_step=None, at=now),
        JobCompleted(job_id=j, attempt=a, at=now),
        JobCancelRequested(job_id=j, at=now),
        JobCancelled(job_id=j, attempt=a, at=now),
        JobPreempted(job_id=j, attempt=a, for_job="x", reason="r", at=now),
        JobAttemptFailed(
            job_id=j, attempt=a, cause="user", reason="r", exit_code=1, retry_at=now + 5, at=now
        ),
        JobInterrupted(job_id=j, attempt=a, failed_nodes=failed, reason="r", at=now),
        JobRequeued(job_id=j, attempt=a, reason="r", epoch=1, computed_at_seq=0, now=now, at=now),
    ]
    return rng.choice(choices)


def node_event(rng: random.Random, node_id: str, now: float) -> Event:
    choices: list[Event] = [
        registered(rng, node_id),
        NodeHeartbeatLost(node_id=node_id, last_seen=now, at=now),
        NodeDrained(node_id=node_id, reason="r", at=now),
        NodeLost(node_id=node_id, reason="r", at=now),
        NodeRecovered(node_id=node_id, at=now),
    ]
    return rng.choice(choices)


def next_event(rng: random.Random, state: ClusterState, now: float) -> Event:
    roll = rng.random()
    if roll < 0.2 or not state.nodes:
        node_id = rng.choice(NODES)
        return node_event(rng, node_id, now) if node_id in state.nodes else registered(rng, node_id)
    if roll < 0.4 or not state.jobs:
        return submitted(f"j{len(state.jobs)}", rng.choice((1, 2, 4)))
    job = state.jobs[rng.choice(sorted(state.jobs))]
    return job_event(rng, state, job, now)


def led_state() -> ClusterState:
    """An empty fold with a scheduler leader, as every history here starts."""
    state = ClusterState()
    state.apply(1, LeaderEpochStarted(epoch=1, leader_id="s", at=0.0))
    return state


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 200))
def test_the_index_agrees_with_a_scan_after_every_event(seed: int, length: int) -> None:
    rng = random.Random(seed)
    state = led_state()
    for seq in range(2, length + 2):
        now = float(seq)
        state.apply(seq, next_event(rng, state, now))
        assert_index_agrees(state, now + rng.choice((-10.0, 0.0, 10.0)))
    # a snapshot restores the same answers (the index is rebuilt from the decoded jobs and nodes)
    restored = ClusterState.decode(state.encode())
    assert restored.hash() == state.hash()
    assert_index_agrees(restored, now)
    assert [j.job_id for j in restored.pending_jobs()] == [j.job_id for j in state.pending_jobs()]
    # and folding on after the restore keeps both in step
    for seq in range(length + 2, length + 40):
        event = next_event(rng, state, float(seq))
        state.apply(seq, event)
        restored.apply(seq, event)
        assert_index_agrees(restored, float(seq))
        assert restored.hash() == state.hash()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 200))
def test_the_index_agrees_with_a_scan_when_read_between_runs_of_events(seed: int, length: int) -> None:
    """Read as the services read it: after a run of events (a job submitted, bound and ended between two
    reads), or its node totals alone; what the events marked is settled when read."""
    rng = random.Random(seed)
    state = led_state()
    for seq in range(2, length + 2):
        now = float(seq)
        state.apply(seq, next_event(rng, state, now))
        roll = rng.random()
        if roll < 0.1:
            assert_index_agrees(state, now)
        elif roll < 0.2:
            assert indexed_totals(state) == scan_totals(state)
    assert_index_agrees(state, float(length + 2))


def test_a_fold_nobody_reads_settles_what_piles_up() -> None:
    """A fold no reader asks (a standby) settles every ``UNSETTLED_LIMIT`` marks: its first read has at
    most that much left to refile, and answers as a scan does."""
    rng = random.Random(3)
    state = led_state()
    seq = 1
    for node_id in NODES:
        seq += 1
        state.apply(seq, registered(rng, node_id))
    for i in range(3 * UNSETTLED_LIMIT):
        seq += 1
        state.apply(seq, submitted(f"q{i}", 1))
        index = state.__dict__["_reader_index"]
        assert len(index._unsettled_jobs) + len(index._unsettled_nodes) < UNSETTLED_LIMIT
    assert_index_agrees(state, float(seq))


def test_the_index_is_outside_the_hash_and_the_snapshot() -> None:
    rng = random.Random(1)
    state = ClusterState()
    for seq, node_id in enumerate(NODES, start=1):
        state.apply(seq, registered(rng, node_id))
    state.apply(10, submitted("j0", 2))
    cold = ClusterState.decode(state.encode())  # holds no index yet
    assert "_reader_index" in state.__dict__ and "_reader_index" not in cold.__dict__
    assert cold.encode() == state.encode() and cold.hash() == state.hash()
    assert state.largest_node_gpus() == max(n.gpu_count for n in state.nodes.values())


def test_an_event_reports_its_job_and_the_nodes_it_may_have_changed() -> None:
    rng = random.Random(2)
    state = ClusterState()
    state.apply(1, LeaderEpochStarted(epoch=1, leader_id="s", at=0.0))
    for seq, node_id in enumerate(("n0", "n1"), start=2):
        state.apply(seq, registered(rng, node_id))
    state.apply(4, submitted("j0", 1))
    one = (TaskPlacement(task=0, node_id="n0", gpus=(0,)),)
    bind = GangBound(
        job_id="j0",
        attempt=1,
        epoch=1,
        placements=one,
        computed_at_seq=0,
        policy_version="p",
        now=5.0,
        at=5.0,
    )
    assert state.apply(5, bind) == Touched(job_id="j0", node_ids=frozenset({"n0"}))
    started = state.apply(6, JobStarted(job_id="j0", attempt=1, resume_step=None, at=6.0))
    assert started == Touched(job_id="j0", node_ids=frozenset())  # no allocation changed
    released = state.apply(7, JobCompleted(job_id="j0", attempt=1, at=7.0))
    assert released == Touched(job_id="j0", node_ids=frozenset({"n0"}))
    lost = state.apply(8, NodeLost(node_id="n1", reason="r", at=8.0))
    assert lost == Touched(job_id=None, node_ids=frozenset({"n1"}))
    epoch = state.apply(9, LeaderEpochStarted(epoch=2, leader_id="s", at=9.0))
    assert epoch == Touched(job_id=None, node_ids=frozenset())
