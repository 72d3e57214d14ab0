"""Given/when/then tests of recovery: the fold's new events, the controller's failure decisions, repairs.

Given these events, when the controller (``reconcile``) or the scheduler (``repair_writes``) looks, then
these actions / events. Every case folds through the wire format, as the services do.
"""

from __future__ import annotations

import pytest
from test_state_fold import EIGHT, bound, led_state, node

from rallypoint.control import Append, Kill, Launch, RecoveryConfig, reconcile, stale_attempts, with_lost_work
from rallypoint.core.cluster import ClusterModel
from rallypoint.events import (
    CheckpointCommitted,
    CheckpointVerified,
    Event,
    GangRepaired,
    JobAttemptFailed,
    JobCompleted,
    JobFailed,
    JobInterrupted,
    JobPreempted,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeatLost,
    NodeLost,
    PreemptionRequested,
    RankExited,
    decode,
    encode,
)
from rallypoint.protocol import RankStatus
from rallypoint.scheduling.bridge import node_of, running_of
from rallypoint.scheduling.repair import repair_writes

CONFIG = RecoveryConfig(
    checkpoint_root="/ckpt", retry_backoff_s=10.0, max_backoff_s=300.0, max_infra_retries=2
)


def submit(job_id: str, gpus: int = 16, *, retries: int = 0, min_gpus: int | None = None) -> JobSubmitted:
    spec = JobSpec(
        name=job_id,
        team="nlp",
        gpus=gpus,
        gpus_per_task=8,
        ranks_per_task=1,
        command=("train",),
        max_retries=retries,
        min_gpus=min_gpus,
        max_gpus=gpus if min_gpus is not None else None,
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)


class World:
    """A fold with a sequence counter: ``given(...)`` appends events through the wire format."""

    def __init__(self, *events: Event) -> None:
        self.state = led_state()
        self.seq = 0
        self.given(*events)

    def given(self, *events: Event) -> World:
        for event in events:
            self.seq += 1
            self.state.apply(self.seq, decode(encode(event)))
        return self

    def reconcile(self, job_id: str, now: float) -> list[Kill | Launch | Append]:
        return reconcile(self.state.jobs[job_id], self.state, now, recovery=CONFIG)

    def repairs(self, now: float, wait: float = 60.0) -> list[Event]:
        model = ClusterModel(node_of(self.state.nodes[k]) for k in sorted(self.state.nodes))
        for job in self.state.active_jobs():
            model.bind(running_of(job))
        writes = repair_writes(
            self.state, model, now, epoch=1, policy_version="t", at=now, repair_wait_s=wait
        )
        return [w.event for w in writes]


def running_gang(*, retries: int = 0, min_gpus: int | None = None) -> World:
    """j1: 16 GPUs on n1 (rack r0) and n2 (rack r1), running since t=10; n3 in r0 and n4 in r1 are free."""
    return World(
        node("n1", rack="r0"),
        node("n2", rack="r1"),
        node("n3", rack="r0"),
        node("n4", rack="r1"),
        submit("j1", retries=retries, min_gpus=min_gpus),
        bound("j1", ("n1", EIGHT), ("n2", EIGHT)),
        JobStarted(job_id="j1", attempt=1, at=10.0),
    )


def exited(rank: int, code: int, attempt: int = 1, node_id: str = "n1") -> RankExited:
    return RankExited(job_id="j1", attempt=attempt, rank=rank, node_id=node_id, exit_code=code, at=20.0)


def committed(step: int, at: float, attempt: int = 1) -> CheckpointCommitted:
    return CheckpointCommitted(
        job_id="j1",
        attempt=attempt,
        step=step,
        path=f"/ckpt/j1/step-{step:012d}",
        manifest_sha256="ab" * 32,
        bytes=100,
        shards=2,
        save_s=0.5,
        node_id="n1",
        at=at,
    )


# --- user failures ---------------------------------------------------------------------------------


def test_a_user_failure_with_retries_left_stops_every_rank_then_waits_out_a_doubling_backoff() -> None:
    world = running_gang(retries=2).given(exited(1, 3, node_id="n2"))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill, Kill) and kill.node_ids == ("n1", "n2") and kill.await_ranks == (0, 1)
    assert isinstance(kill.then, JobAttemptFailed)
    assert (kill.then.cause, kill.then.exit_code, kill.then.retry_at) == ("user", 3, 40.0)
    world.given(kill.then)
    job = world.state.jobs["j1"]
    assert (job.state, job.user_failures, job.placements) == ("pending", 1, ())
    assert world.state.free_gpus() == 32
    assert world.state.ready_jobs(39.0) == [] and world.state.ready_jobs(40.0) == [job]
    # attempt 2 fails too: the next backoff is twice as long
    world.given(
        bound("j1", ("n3", EIGHT), ("n4", EIGHT), attempt=2), JobStarted(job_id="j1", attempt=2, at=50.0)
    )
    world.given(exited(0, 1, attempt=2, node_id="n3"))
    [kill] = world.reconcile("j1", 60.0)
    assert isinstance(kill.then, JobAttemptFailed) and kill.then.retry_at == 80.0


def test_past_max_retries_the_job_fails_with_a_reason_naming_every_attempt() -> None:
    world = running_gang(retries=1).given(exited(0, 2))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill.then, JobAttemptFailed)
    world.given(kill.then, bound("j1", ("n1", EIGHT), ("n2", EIGHT), attempt=2))
    world.given(JobStarted(job_id="j1", attempt=2, at=50.0), exited(0, 2, attempt=2))
    [kill] = world.reconcile("j1", 60.0)
    assert isinstance(kill.then, JobFailed) and kill.then.exit_code == 2
    assert "attempt 1: rank 0 exited with code 2" in kill.then.reason
    assert "attempt 2: rank 0 exited with code 2" in kill.then.reason
    assert "max_retries 1" in kill.then.reason


def test_a_job_without_retries_fails_at_once_with_the_plain_reason() -> None:
    world = running_gang().given(exited(0, 1))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill.then, JobFailed) and kill.then.reason == "rank 0 exited with code 1"


@pytest.mark.parametrize(("code", "says"), [(126, "could not be executed"), (127, "command not found")])
def test_a_rank_that_could_not_start_its_command_fails_with_a_reason_that_says_so(
    code: int, says: str
) -> None:
    world = running_gang().given(exited(0, code))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill.then, JobFailed) and kill.then.exit_code == code
    assert kill.then.reason.startswith(f"rank 0 exited with code {code} (") and says in kill.then.reason


def test_a_rank_failure_while_a_node_of_the_gang_is_silent_waits_for_the_verdict() -> None:
    world = running_gang(retries=3).given(
        NodeHeartbeatLost(node_id="n2", last_seen=20.0, at=25.0), exited(0, 1, node_id="n1")
    )
    assert world.reconcile("j1", 26.0) == []
    world.given(NodeLost(node_id="n2", reason="no heartbeat for 8 s", at=30.0))
    [kill] = world.reconcile("j1", 31.0)
    assert isinstance(kill.then, JobInterrupted)  # the node's fault, not the user's
    assert world.state.jobs["j1"].user_failures == 0


# --- infrastructure failures and in-place repair ---------------------------------------------------


def test_a_lost_node_interrupts_the_gang_which_keeps_its_healthy_nodes_gpus() -> None:
    world = running_gang().given(NodeLost(node_id="n2", reason="no heartbeat", at=30.0))
    [kill] = world.reconcile("j1", 31.0)
    assert isinstance(kill, Kill) and kill.await_ranks == (0,)  # n2's rank 1 can never report
    world.given(with_lost_work(kill.then, world.state.jobs["j1"], 32.0))  # type: ignore[arg-type]
    job = world.state.jobs["j1"]
    assert (job.state, job.failed_nodes, job.missing_tasks, job.infra_failures) == (
        "repairing",
        ("n2",),
        (1,),
        1,
    )
    assert job.user_failures == 0 and job.lost_gpu_s == 16 * 22.0
    assert set(world.state.nodes["n1"].allocated.values()) == {"j1"}
    assert world.state.nodes["n2"].allocated == {}


def test_the_scheduler_swaps_in_a_free_node_of_the_survivors_rack_as_a_new_attempt() -> None:
    world = running_gang().given(
        NodeLost(node_id="n2", reason="x", at=30.0),
        JobInterrupted(job_id="j1", attempt=1, failed_nodes=("n2",), reason="x", at=31.0),
    )
    [repair] = world.repairs(now=32.0)
    assert isinstance(repair, GangRepaired) and repair.attempt == 2
    # n1 survives in r0, so n3 (r0) beats n4 (r1)
    assert [(p.task, p.node_id) for p in repair.placements] == [(0, "n1"), (1, "n3")]
    assert [(s.task, s.from_node, s.to_node) for s in repair.swaps] == [(1, "n2", "n3")]
    world.given(repair)
    job = world.state.jobs["j1"]
    assert (job.state, job.attempt) == ("bound", 2)
    assert world.state.nodes["n1"].allocated == dict.fromkeys(EIGHT, "j1")
    [launch] = world.reconcile("j1", 33.0)
    assert isinstance(launch, Launch) and {t.node_id for t in launch.tasks} == {"n1", "n3"}


def test_no_replacement_in_time_requeues_the_gang_at_its_place_and_an_elastic_one_shrinks() -> None:
    for min_gpus, expected in ((None, JobRequeued), (8, GangRepaired)):
        world = running_gang(min_gpus=min_gpus).given(
            NodeLost(node_id="n3", reason="x", at=1.0),
            NodeLost(node_id="n4", reason="x", at=1.0),
            NodeLost(node_id="n2", reason="x", at=30.0),
            JobInterrupted(job_id="j1", attempt=1, failed_nodes=("n2",), reason="x", at=31.0),
        )
        assert world.repairs(now=60.0, wait=60.0) == []
        [event] = world.repairs(now=91.0, wait=60.0)
        assert isinstance(event, expected)
        world.given(event)
        job = world.state.jobs["j1"]
        if isinstance(event, GangRepaired):
            assert event.shrunk and [(p.task, p.node_id) for p in event.placements] == [(0, "n1")]
            assert (job.state, job.world_size) == ("bound", 1)
        else:
            assert (job.state, job.submitted_seq) == ("pending", 5) and world.state.free_gpus() == 8


def test_infrastructure_failures_do_not_use_max_retries_but_have_their_own_cap() -> None:
    world = running_gang(retries=0)
    for attempt, lost in ((1, "n2"), (2, "n3")):
        world.given(NodeLost(node_id=lost, reason="x", at=30.0))
        [kill] = world.reconcile("j1", 31.0)
        assert isinstance(kill.then, JobInterrupted)
        world.given(kill.then)
        [repair] = world.repairs(now=32.0)
        world.given(repair, JobStarted(job_id="j1", attempt=attempt + 1, at=33.0))
    world.given(NodeLost(node_id="n4", reason="x", at=40.0))
    [kill] = world.reconcile("j1", 41.0)
    assert isinstance(kill.then, JobFailed) and "gave up after 2" in kill.then.reason


def test_a_rank_lost_with_its_agent_relaunches_the_gang_in_place() -> None:
    world = running_gang().given(exited(1, -1, node_id="n2"))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill.then, JobInterrupted) and kill.then.failed_nodes == ()
    world.given(kill.then)
    [repair] = world.repairs(now=31.0)
    assert isinstance(repair, GangRepaired) and repair.swaps == ()
    assert [p.node_id for p in repair.placements] == ["n1", "n2"]


def test_ranks_stopped_with_the_cluster_are_the_infrastructures_failure_and_run_again() -> None:
    # Ctrl-C on `rally up` records -2 for the ranks it stops (Issue 18): not the user's failure (no
    # retries spent, no exit code), but an interruption that relaunches the gang when the cluster is back.
    world = running_gang().given(exited(0, -2), exited(1, -2, node_id="n2"))
    [kill] = world.reconcile("j1", 30.0)
    assert isinstance(kill.then, JobInterrupted) and kill.then.failed_nodes == ()
    assert "cluster was stopped" in kill.then.reason and "rank 0" in kill.then.reason
    world.given(kill.then)
    assert world.state.jobs["j1"].user_failures == 0
    [repair] = world.repairs(now=31.0)
    assert isinstance(repair, GangRepaired) and [p.node_id for p in repair.placements] == ["n1", "n2"]


def test_a_drained_node_under_a_gang_is_replaced_too() -> None:
    # j1 is training-standard: its drain policy waits for its next checkpoint (test_drain_policy.py has
    # every class); a checkpoint committed after the drain makes the eviction due.
    world = running_gang().given(NodeDrained(node_id="n1", reason="GPU 3: XID 79", at=30.0))
    assert world.reconcile("j1", 31.0) == []
    world.given(committed(5, at=40.0))
    [kill] = world.reconcile("j1", 41.0)
    assert isinstance(kill.then, JobInterrupted) and kill.then.failed_nodes == ("n1",)
    assert "XID 79" in kill.then.reason


def test_two_repairs_in_one_cycle_never_share_a_gpu() -> None:
    world = World(
        node("n1", rack="r0"),
        node("n2", rack="r0"),
        node("n3", rack="r0"),
        node("n4", rack="r0"),
        node("n5", rack="r0"),
        submit("a", 16),
        submit("b", 16),
        bound("a", ("n1", EIGHT), ("n2", EIGHT)),
        bound("b", ("n3", EIGHT), ("n4", EIGHT)),
        JobStarted(job_id="a", attempt=1, at=1.0),
        JobStarted(job_id="b", attempt=1, at=1.0),
        NodeLost(node_id="n2", reason="x", at=2.0),
        NodeLost(node_id="n4", reason="x", at=2.0),
        JobInterrupted(job_id="a", attempt=1, failed_nodes=("n2",), reason="x", at=2.0),
        JobInterrupted(job_id="b", attempt=1, failed_nodes=("n4",), reason="x", at=2.0),
    )
    events = world.repairs(now=3.0, wait=60.0)
    assert [type(e) for e in events] == [GangRepaired]  # only n5 is free: a takes it, b waits
    assert isinstance(events[0], GangRepaired) and events[0].job_id == "a"


# --- checkpoints, lost work, resume ----------------------------------------------------------------


def test_lost_work_counts_from_the_newest_complete_checkpoint_and_the_restart_resumes_from_it() -> None:
    world = running_gang().given(
        committed(100, at=40.0),
        committed(200, at=50.0),
        CheckpointVerified(job_id="j1", step=200, ok=False, at=51.0),
    )
    job = world.state.jobs["j1"]
    assert job.latest_checkpoint() is not None and job.latest_checkpoint().step == 100  # type: ignore[union-attr]
    ask = PreemptionRequested(
        job_id="j1", attempt=1, for_job="x", reason="priority", epoch=1, computed_at_seq=1,
        policy_version="t", now=60.0, at=60.0,
    )  # fmt: skip
    world.given(ask)
    [kill] = world.reconcile("j1", 60.0)
    assert isinstance(kill.then, JobPreempted) and kill.grace_s == 30.0 and kill.await_ranks == (0, 1)
    final = with_lost_work(kill.then, job, 70.0)
    assert isinstance(final, JobPreempted)
    assert (final.lost_gpu_s, final.checkpoint_step, final.at) == (16 * 30.0, 100, 70.0)
    world.given(final, bound("j1", ("n3", EIGHT), ("n4", EIGHT), attempt=2))
    [launch] = world.reconcile("j1", 80.0)
    assert isinstance(launch, Launch) and launch.then.resume_step == 100
    env = launch.tasks[0].env
    assert env["RALLY_CHECKPOINT_DIR"] == "/ckpt/j1" and env["RALLY_RESUME_STEP"] == "100"
    assert world.state.jobs["j1"].lost_gpu_s == 480.0


def test_a_later_attempt_saving_a_step_again_replaces_its_record() -> None:
    world = running_gang().given(
        committed(100, at=40.0),
        CheckpointVerified(job_id="j1", step=100, ok=False, error="bad shard", at=41.0),
    )
    assert world.state.jobs["j1"].latest_checkpoint() is None
    world.given(committed(100, at=45.0))  # the same attempt again: a retried append, the first record stands
    assert world.state.jobs["j1"].checkpoints[0].status == "corrupt"
    world.given(committed(100, at=90.0, attempt=2))
    [record] = world.state.jobs["j1"].checkpoints
    assert (record.attempt, record.status, record.committed_at) == (2, "committed", 90.0)
    assert world.state.jobs["j1"].last_checkpoint_at == 90.0


def test_completion_follows_the_bound_ranks_not_the_spec() -> None:
    world = running_gang(min_gpus=8).given(exited(0, 0))
    assert world.reconcile("j1", 30.0) == []
    world.given(exited(1, 0, node_id="n2"))
    [done] = world.reconcile("j1", 31.0)
    assert isinstance(done, Append) and isinstance(done.event, JobCompleted)


@pytest.mark.parametrize("attempt, expected", [(1, []), (0, [("j1", 0)])])
def test_a_node_back_from_the_dead_kills_only_ranks_of_attempts_the_log_moved_on_from(
    attempt: int, expected: list[tuple[str, int]]
) -> None:
    world = running_gang()
    ranks = [
        RankStatus(job_id="j1", attempt=attempt, rank=0, pid=1),
        RankStatus(job_id="gone", attempt=1, rank=0, pid=2),
    ]
    assert stale_attempts(world.state, "n1", ranks) == sorted([*expected, ("gone", 1)])
