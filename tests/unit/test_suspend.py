"""Suspend and resume, and services, in the fold and the job controller's reconcile (issue 35, items 3, 5)."""

from __future__ import annotations

from test_state_fold import EIGHT, bound, fold, node, submit

from rallypoint.control.reconcile import Append, Kill, reconcile
from rallypoint.events import JobResumed, JobStarted, JobSuspended, JobSuspendRequested
from rallypoint.state import ClusterState


def _apply(state: ClusterState, *events: object) -> None:
    for event in events:
        state.apply(state.last_seq + 1, event)  # type: ignore[arg-type]


def test_a_running_job_checkpoints_stops_frees_its_gpus_and_resumes_in_its_place() -> None:
    state = fold(node("n1"), submit("j1", 8), submit("j2", 8), bound("j1", ("n1", EIGHT)))
    _apply(state, JobStarted(job_id="j1", attempt=1, at=4.0), JobSuspendRequested(job_id="j1", at=10.0))
    job = state.jobs["j1"]
    assert job.suspend_requested and job.state == "running"
    (kill,) = reconcile(job, state, 10.0)
    # the preemption grace to checkpoint, and only once every rank has stopped is it suspended
    assert isinstance(kill, Kill) and kill.grace_s > 0 and isinstance(kill.then, JobSuspended)
    assert kill.then.attempt == 1
    _apply(state, JobSuspended(job_id="j1", attempt=1, lost_gpu_s=8.0, at=20.0))
    assert job.state == "suspended" and not job.suspend_requested and state.free_gpus() == 8
    assert [j.job_id for j in state.ready_jobs(21.0)] == ["j2"]  # the scheduler leaves it alone
    assert reconcile(job, state, 30.0) == []  # and so does the controller, until a resume
    _apply(state, JobResumed(job_id="j1", at=50.0))
    assert job.state == "pending" and job.suspended_s == 30.0 and job.lost_gpu_s == 8.0
    assert [j.job_id for j in state.ready_jobs(51.0)] == ["j1", "j2"]  # its original place, ahead of j2
    assert job.attempt == 1  # the next bind is attempt 2, resuming from its latest checkpoint


def test_a_waiting_job_is_suspended_at_once_and_a_resume_before_that_withdraws_the_request() -> None:
    state = fold(node("n1"), submit("j1", 8))
    _apply(state, JobSuspendRequested(job_id="j1", at=5.0))
    job = state.jobs["j1"]
    assert state.ready_jobs(6.0) == []  # being suspended: not bound meanwhile
    (append,) = reconcile(job, state, 6.0)
    assert isinstance(append, Append) and append.event == JobSuspended(job_id="j1", attempt=None, at=6.0)
    _apply(state, JobResumed(job_id="j1", at=7.0))  # before the suspension took effect
    assert job.state == "pending" and not job.suspend_requested
    _apply(state, JobSuspended(job_id="j1", attempt=None, at=8.0))  # late: nothing was asked any more
    assert job.state == "pending" and reconcile(job, state, 9.0) == []


def test_a_suspension_of_another_attempt_changes_nothing() -> None:
    state = fold(node("n1"), submit("j1", 8), bound("j1", ("n1", EIGHT)))
    _apply(state, JobSuspendRequested(job_id="j1", at=5.0))
    for attempt in (None, 2):  # written for a waiting job, or for an attempt that is not this one
        _apply(state, JobSuspended(job_id="j1", attempt=attempt, at=6.0))
        assert state.jobs["j1"].state == "bound" and state.free_gpus() == 0
    _apply(state, JobSuspended(job_id="j1", attempt=1, at=7.0))
    assert state.jobs["j1"].state == "suspended" and state.free_gpus() == 8


def test_a_service_restarts_whenever_its_ranks_exit_and_is_never_a_victim() -> None:
    import msgspec

    from rallypoint.events import JobAttemptFailed, JobSubmitted, RankExited
    from rallypoint.scheduling.bridge import running_of

    plain = submit("svc", 8)
    service = JobSubmitted(
        job_id="svc",
        spec=msgspec.structs.replace(plain.spec, kind="service"),
        submitted_at=plain.submitted_at,
    )
    state = fold(node("n1"), service, bound("svc", ("n1", EIGHT)))
    _apply(state, JobStarted(job_id="svc", attempt=1, at=4.0))
    job = state.jobs["svc"]
    assert not running_of(job).preemptible
    for rank in range(8):  # every rank exits cleanly: a batch job would complete
        _apply(state, RankExited(job_id="svc", attempt=1, rank=rank, node_id="n1", exit_code=0, at=5.0))
    (append,) = reconcile(job, state, 6.0)
    assert isinstance(append, Append) and isinstance(append.event, JobAttemptFailed), append
    assert append.event.retry_at is not None and append.event.retry_at > 6.0  # after the backoff
    # and past max_retries (0) it still restarts after a crash
    _apply(state, append.event)
    assert job.state == "pending" and job.user_failures == 1
    _apply(state, bound("svc", ("n1", EIGHT), attempt=2), JobStarted(job_id="svc", attempt=2, at=20.0))
    _apply(state, RankExited(job_id="svc", attempt=2, rank=3, node_id="n1", exit_code=139, at=21.0))
    actions = reconcile(job, state, 22.0)
    assert isinstance(actions[0], Kill) and isinstance(actions[0].then, JobAttemptFailed), actions
