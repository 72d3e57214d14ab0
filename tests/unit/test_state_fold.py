"""Given/when/then tests of the shared fold: given these events, the state is this."""

from __future__ import annotations

import msgspec
import pytest

from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    MigSlice,
    NodeDrained,
    NodeRegistered,
    RankExited,
    TaskPlacement,
    decode,
    encode,
)
from rallypoint.scheduling.bridge import pending_of, running_of
from rallypoint.state import ClusterState, cluster


def node(node_id: str, rack: str = "r0", gpus: int = 8) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack=rack,
        gpu_type="sim",
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(gpus)
        ),
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def submit(job_id: str, gpus: int, per_task: int = 8) -> JobSubmitted:
    spec = JobSpec(
        name=job_id, team="nlp", gpus=gpus, gpus_per_task=per_task, ranks_per_task=per_task, command=("true",)
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)


def bound(job_id: str, *tasks: tuple[str, tuple[int, ...]], attempt: int = 1) -> GangBound:
    placements = tuple(TaskPlacement(task=i, node_id=n, gpus=g) for i, (n, g) in enumerate(tasks))
    return GangBound(
        job_id=job_id,
        attempt=attempt,
        epoch=1,
        placements=placements,
        computed_at_seq=0,
        policy_version="test",
        now=3.0,
        at=3.0,
    )


#: Leaders in epoch 1 of both fenced trees: the fold counts only the current epoch's decisions.
LEADERS = (
    LeaderEpochStarted(epoch=1, leader_id="sched", at=0.0),
    LeaderEpochStarted(epoch=1, leader_id="preempt", role="preemption", at=0.0),
)


def led_state() -> ClusterState:
    """An empty fold whose scheduler and preemption leaders started epoch 1 (folded before seq 1, so a
    scenario's sequence numbers stay as written)."""
    state = ClusterState()
    for event in LEADERS:
        state.apply(0, event)
    return state


def fold(*events: Event) -> ClusterState:
    state = led_state()
    for seq, event in enumerate(events, start=1):
        # Round-trip through the wire format: the fold must work on what the log actually stores.
        state.apply(seq, decode(encode(event)))
    return state


EIGHT = tuple(range(8))


def test_a_bound_gang_holds_exactly_its_gpus_and_completion_frees_them() -> None:
    state = fold(node("n1"), node("n2"), submit("j1", 16), bound("j1", ("n1", EIGHT), ("n2", EIGHT)))
    assert state.jobs["j1"].state == "bound"
    assert state.free_gpus() == 0
    state.apply(5, JobStarted(job_id="j1", attempt=1, at=4.0))
    state.apply(6, RankExited(job_id="j1", attempt=1, rank=0, node_id="n1", exit_code=0, at=5.0))
    state.apply(7, JobCompleted(job_id="j1", attempt=1, at=5.0))
    assert state.jobs["j1"].state == "completed"
    assert state.jobs["j1"].ranks_exited == {0: 0}
    assert state.free_gpus() == 16


def test_a_bind_on_gpus_already_held_is_ignored_never_double_booked() -> None:
    state = fold(
        node("n1"), submit("j1", 8), submit("j2", 8), bound("j1", ("n1", EIGHT)), bound("j2", ("n1", EIGHT))
    )
    assert state.jobs["j1"].state == "bound"
    assert state.jobs["j2"].state == "pending"
    assert state.ignored_binds == 1
    assert set(state.nodes["n1"].allocated.values()) == {"j1"}


def test_a_bind_after_cancel_request_is_ignored() -> None:
    state = fold(
        node("n1"), submit("j1", 8), JobCancelRequested(job_id="j1", at=2.5), bound("j1", ("n1", EIGHT))
    )
    assert state.jobs["j1"].state == "pending" and state.jobs["j1"].cancel_requested
    assert state.free_gpus() == 8
    state.apply(5, JobCancelled(job_id="j1", at=3.0))
    assert state.jobs["j1"].state == "cancelled"
    assert state.pending_jobs() == []


def test_terminal_states_are_final() -> None:
    state = fold(
        node("n1"),
        submit("j1", 8),
        bound("j1", ("n1", EIGHT)),
        JobFailed(job_id="j1", attempt=1, reason="rank 3 exited 1", exit_code=1, at=4.0),
        JobCompleted(job_id="j1", attempt=1, at=5.0),
    )
    assert state.jobs["j1"].state == "failed"
    assert state.jobs["j1"].exit_code == 1
    assert state.free_gpus() == 8


def test_a_drained_node_offers_no_gpus_and_stays_drained_when_its_agent_reregisters() -> None:
    state = fold(node("n1"), node("n2"), NodeDrained(node_id="n1", reason="ECC", at=2.0), node("n1"))
    assert state.nodes["n1"].status == "drained"
    assert state.free_gpus() == 8


def test_pending_jobs_come_in_log_order() -> None:
    state = fold(node("n1"), submit("b", 8), submit("a", 8), submit("c", 8))
    assert [j.job_id for j in state.pending_jobs()] == ["b", "a", "c"]


def test_hash_is_equal_for_equal_histories_and_survives_a_snapshot_round_trip() -> None:
    events = (
        node("n1"),
        submit("j1", 8),
        bound("j1", ("n1", EIGHT)),
        LeaderEpochStarted(epoch=3, leader_id="s", at=1),
    )
    one, two = fold(*events), fold(*events)
    assert one.hash() == two.hash()
    assert ClusterState.decode(one.encode()).hash() == one.hash()
    different = fold(*events[:-1])
    assert different.hash() != one.hash()


def test_events_for_unknown_jobs_are_counted_not_fatal() -> None:
    state = fold(JobStarted(job_id="ghost", attempt=1, at=1.0))
    assert state.orphans == 1


def test_preempted_attempts_add_up_their_service_and_the_bridge_hands_it_to_the_core() -> None:
    # Attempt 1: 16 GPUs from 4 to 104 (100 s); attempt 2: 8 GPUs from 200 to 250 (50 s); attempt 3 runs.
    # The job is elastic (8..16 GPUs): a bind of another size than the spec's would be refused.
    submitted = submit("j1", 16)
    elastic = msgspec.structs.replace(submitted, spec=msgspec.structs.replace(submitted.spec, min_gpus=8))
    state = fold(
        node("n1"),
        node("n2"),
        elastic,
        bound("j1", ("n1", EIGHT), ("n2", EIGHT)),
        JobStarted(job_id="j1", attempt=1, at=4.0),
        JobPreempted(job_id="j1", attempt=1, for_job="x", reason="priority", at=104.0),
        bound("j1", ("n1", EIGHT), attempt=2),
        JobStarted(job_id="j1", attempt=2, at=200.0),
        JobPreempted(job_id="j1", attempt=2, for_job="x", reason="las", at=250.0),
    )
    job = state.jobs["j1"]
    assert (job.state, job.run_s, job.attained_gpu_s) == ("pending", 150.0, 16 * 100.0 + 8 * 50.0)
    pending = pending_of(job)
    assert (pending.attained_gpu_s, pending.last_run_s) == (2000.0, 150.0)
    state.apply(20, bound("j1", ("n2", EIGHT), attempt=3))
    assert running_of(state.jobs["j1"]).attained_gpu_s == 2000.0


def test_a_share_or_a_mig_slice_attains_service_for_its_part_of_a_gpu() -> None:
    """100 s on a quarter of a GPU is 25 GPU-seconds of service, on a 3g MIG slice 42.8 (3 of 7 compute
    slices, as quota counts it): the LAS levels then order a notebook by what it held, not as a whole GPU."""

    def part(job_id: str, **kw: object) -> JobSubmitted:
        base = submit(job_id, 1, per_task=1)
        return msgspec.structs.replace(base, spec=msgspec.structs.replace(base.spec, **kw))

    plain = node("m1", gpus=1)
    mig_node = msgspec.structs.replace(
        plain, gpu_type="H100", gpus=(msgspec.structs.replace(plain.gpus[0], mig=True),)
    )
    sliced = msgspec.structs.replace(
        bound("ev", ("m1", (0,))),
        placements=(
            TaskPlacement(task=0, node_id="m1", gpus=(0,), mig=MigSlice(profile="3g.40gb", start=0)),
        ),
    )
    events: list[Event] = [node("n1"), mig_node, part("nb", gpu_milli=250), part("ev", mig_profile="3g.40gb")]
    for job_id, bind in (("nb", bound("nb", ("n1", (0,)))), ("ev", sliced)):
        events += [
            bind,
            JobStarted(job_id=job_id, attempt=1, at=4.0),
            JobPreempted(job_id=job_id, attempt=1, for_job="x", reason="priority", at=104.0),
        ]
    state = fold(*events)
    assert state.jobs["nb"].attained_gpu_s == 25.0
    assert state.jobs["ev"].attained_gpu_s == 100.0 * 0.428


def test_a_preemption_before_the_start_adds_no_service() -> None:
    state = fold(
        node("n1"),
        submit("j1", 8),
        bound("j1", ("n1", EIGHT)),
        JobPreempted(job_id="j1", attempt=1, for_job="x", reason="priority", at=50.0),
    )
    assert (state.jobs["j1"].run_s, state.jobs["j1"].attained_gpu_s) == (0.0, 0.0)


def test_a_snapshot_of_another_fold_version_is_refused_not_read_with_defaults() -> None:
    state = fold(node("n1"), submit("j1", 8))
    assert ClusterState.decode(state.encode()) == state
    older = msgspec.msgpack.encode(state)  # how version 1 wrote its snapshots: the bare state
    other = msgspec.msgpack.encode([cluster.FOLD_VERSION + 1, state])
    for payload in (older, other):
        with pytest.raises(msgspec.ValidationError):
            ClusterState.decode(payload)
