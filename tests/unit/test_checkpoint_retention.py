"""Given/when/then tests of the checkpoint service's decisions: given these checkpoint events, when the
service plans with this ``keep``, then it verifies these steps and deletes those.

A job's history is written as one token per step: ``c`` committed (awaiting verification), ``v``
verified, ``x`` found corrupt, ``d`` deleted, then the step number; ``"v1 v2 x3"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.checkpoints import (
    REASON_CORRUPT,
    REASON_RETENTION,
    Delete,
    RetentionPolicy,
    Verify,
    deleted_event,
    deleted_msg_id,
    is_step_folder,
    keep_files_because,
    mismatch,
    plan_checkpoints,
    plan_jobs,
    verified_event,
    verified_msg_id,
)
from rallypoint.events import (
    CheckpointCommitted,
    CheckpointDeleted,
    CheckpointVerified,
    Event,
    JobSpec,
    JobSubmitted,
)
from rallypoint.state import ClusterState, JobView

JOB = "j-1"


def sha(step: int) -> str:
    return f"{step:064x}"


def path(step: int) -> str:
    return f"/ckpt/{JOB}/step-{step:012d}"


def history_events(history: str, job_id: str = JOB) -> list[Event]:
    spec = JobSpec(name="train", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("true",))
    events: list[Event] = [JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)]
    for token in history.split():
        status, step = token[0], int(token[1:])
        events.append(
            CheckpointCommitted(
                job_id=job_id,
                attempt=1,
                step=step,
                path=path(step),
                manifest_sha256=sha(step),
                bytes=1000,
                shards=8,
                save_s=0.5,
                node_id="n0",
                at=10.0 + step,
            )
        )
        if status in "vx":
            error = "" if status == "v" else f"shard 3 of step {step}: sha256 mismatch"
            events.append(
                CheckpointVerified(job_id=job_id, step=step, ok=status == "v", error=error, at=20.0)
            )
        elif status == "d":
            events.append(CheckpointDeleted(job_id=job_id, step=step, reason="retention", at=30.0))
    return events


def given_state(*histories: tuple[str, str]) -> ClusterState:
    state = ClusterState()
    seq = 0
    for job_id, history in histories:
        for event in history_events(history, job_id):
            seq += 1
            state.apply(seq, event)
    return state


def given_job(history: str) -> JobView:
    return given_state((JOB, history)).jobs[JOB]


def delete(step: int, reason: str, at: str | None = None) -> Delete:
    return Delete(job_id=JOB, step=step, path=at or path(step), manifest_sha256=sha(step), reason=reason)


# (history, keep, steps verified, {deleted step: reason prefix})
CASES = [
    ("", 3, [], {}),
    ("c1", 3, [1], {}),
    ("v1 v2 v3", 3, [], {}),
    ("v1 v2 v3 v4 v5", 3, [], {1: REASON_RETENTION, 2: REASON_RETENTION}),
    ("v1 v2 v3 v4", 1, [], {1: REASON_RETENTION, 2: REASON_RETENTION, 3: REASON_RETENTION}),
    # A corrupt step is not complete: it neither counts towards keep nor survives.
    ("v1 v2 v3 x4", 3, [], {4: REASON_CORRUPT}),
    ("v1 v2 x3 x4", 1, [], {1: REASON_RETENTION, 3: REASON_CORRUPT, 4: REASON_CORRUPT}),
    # The newest complete step is kept however many newer steps are corrupt.
    ("v1 x2 x3 x4 x5", 3, [], {2: REASON_CORRUPT, 3: REASON_CORRUPT, 4: REASON_CORRUPT, 5: REASON_CORRUPT}),
    ("v1 x2 x3 x4 x5", 1, [], {2: REASON_CORRUPT, 3: REASON_CORRUPT, 4: REASON_CORRUPT, 5: REASON_CORRUPT}),
    # A pending step counts towards keep once a kept step is verified...
    ("v1 v2 v3 c4", 3, [4], {1: REASON_RETENTION}),
    # ...and while none is, the newest verified older step is kept as the fallback.
    ("v1 c2 c3 c4", 3, [2, 3, 4], {}),
    ("v1 v2 c3", 1, [3], {1: REASON_RETENTION}),
    ("v1 v2 c3 c4 c5", 3, [3, 4, 5], {1: REASON_RETENTION}),
    # Nothing verified yet: nothing is deleted until a verification says what is complete.
    ("c1 c2 c3 c4", 3, [1, 2, 3, 4], {}),
    ("c1 c2", 1, [1, 2], {}),
    # Older steps awaiting verification are still beyond keep once a kept one is verified.
    ("c1 v2", 1, [1], {1: REASON_RETENTION}),
    # Deleted steps are history: nothing more to do, and they do not count.
    ("d1 d2 v3", 1, [], {}),
    ("d1 x2 v3 v4", 1, [], {2: REASON_CORRUPT, 3: REASON_RETENTION}),
]


@pytest.mark.parametrize(("history", "keep", "verified", "deleted"), CASES)
def test_plan(history: str, keep: int, verified: list[int], deleted: dict[int, str]) -> None:
    plan = plan_checkpoints(given_job(history), RetentionPolicy(keep=keep))

    assert [v.step for v in plan.verify] == verified
    assert {d.step: d.reason.split(":")[0] for d in plan.delete} == deleted
    assert plan.empty == (not verified and not deleted)


def test_a_verification_carries_what_the_commit_recorded() -> None:
    plan = plan_checkpoints(given_job("v1 c2"), RetentionPolicy())

    assert plan.verify == (Verify(job_id=JOB, step=2, path=path(2), manifest_sha256=sha(2)),)


def test_a_deletion_says_why() -> None:
    plan = plan_checkpoints(given_job("v1 v2 x3"), RetentionPolicy(keep=1))

    assert plan.delete == (
        delete(3, "corrupt: shard 3 of step 3: sha256 mismatch"),
        delete(1, "retention: older than the newest 1 complete checkpoints"),
    )


def test_the_default_keeps_three() -> None:
    plan = plan_checkpoints(given_job("v1 v2 v3 v4"), RetentionPolicy())

    assert [d.step for d in plan.delete] == [1]


def test_keep_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetentionPolicy(keep=0)


def test_plan_jobs_returns_only_jobs_with_work_in_id_order() -> None:
    state = given_state(("j-b", "c1"), ("j-a", "v1 v2 v3 v4"), ("j-c", "v1"))

    plans = plan_jobs(state, ["j-c", "j-b", "j-unknown", "j-a", "j-b"], RetentionPolicy())

    assert [p.job_id for p in plans] == ["j-a", "j-b"]


# --- the invariants, over any history --------------------------------------------------------------

histories = st.lists(st.sampled_from("cvxd"), max_size=12).map(
    lambda statuses: " ".join(f"{s}{i}" for i, s in enumerate(statuses, start=1))
)


@settings(max_examples=400, deadline=None)
@given(histories, st.integers(min_value=1, max_value=5), st.data())
def test_no_plan_leaves_a_job_without_a_complete_checkpoint(
    history: str, keep: int, data: st.DataObject
) -> None:
    job = given_job(history)
    plan = plan_checkpoints(job, RetentionPolicy(keep=keep))
    by_step = {c.step: c for c in job.checkpoints}
    deleted = {d.step for d in plan.delete}

    # Only committed steps are verified; deleted steps are never touched again.
    assert {v.step for v in plan.verify} == {s for s, c in by_step.items() if c.status == "committed"}
    assert all(by_step[s].status != "deleted" for s in deleted)
    # Every corrupt step goes; the newest `keep` complete steps stay.
    assert {s for s, c in by_step.items() if c.status == "corrupt"} <= deleted
    complete = sorted(s for s, c in by_step.items() if c.complete)
    assert not deleted & set(complete[-keep:])
    # Whatever the pending verifications find, a job that had a verified step keeps one that is
    # verified or still pending: let them fail in any combination and a complete step remains.
    failing = data.draw(st.sets(st.sampled_from([v.step for v in plan.verify] or [0])))
    survivors = [s for s in complete if s not in deleted and s not in failing]
    if any(c.status == "verified" for c in by_step.values()):
        assert survivors
    if not any(c.status == "verified" for c in by_step.values()):
        assert not deleted - {s for s, c in by_step.items() if c.status == "corrupt"}


# --- the events a plan's actions become ------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What the training client's verifier reports (the fields the service reads)."""

    ok: bool
    error: str = ""
    step: int | None = 2
    manifest_sha256: str = sha(2)


TASK = Verify(job_id=JOB, step=2, path=path(2), manifest_sha256=sha(2))


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        (Outcome(ok=True), ""),
        (Outcome(ok=False, error="rank 1 has no .done marker"), "rank 1 has no .done marker"),
        (Outcome(ok=False, error=""), "verification failed"),
        (Outcome(ok=True, manifest_sha256=sha(9)), "manifest sha256 000000000000 differs from the committed"),
        (Outcome(ok=True, step=3), "manifest is for step 3, committed as step 2"),
    ],
)
def test_verification_verdicts(outcome: Outcome, error: str) -> None:
    assert mismatch(TASK, outcome).startswith(error)
    assert bool(error) or mismatch(TASK, outcome) == ""

    event = verified_event(TASK, outcome, at=5.0)

    assert (event.job_id, event.step, event.ok, event.at) == (JOB, 2, not error, 5.0)
    assert event.error == mismatch(TASK, outcome)


def test_deleted_event_and_message_ids() -> None:
    task = DELETE

    assert deleted_event(task, 7.0) == CheckpointDeleted(job_id=JOB, step=1, reason="retention: x", at=7.0)
    assert deleted_event(task, 7.0, left_because="why").reason == "retention: x; files left in place: why"
    assert verified_msg_id(JOB, 1) == "j-1:ckpt:1:verified"
    assert deleted_msg_id(JOB, 1) == "j-1:ckpt:1:deleted"


DELETE = delete(1, "retention: x")


@pytest.mark.parametrize(
    ("candidate", "manifest", "why"),
    [
        (path(1), sha(1), ""),  # the committed checkpoint's folder
        (path(1), None, ""),  # its manifest is gone already (a half-finished earlier removal)
        (path(1), sha(9), "its manifest was rewritten after the commit"),  # a later save of step 1
        (path(2), sha(1), f"{path(2)} is not the folder of step 1"),
        ("/ckpt/j-1", None, "/ckpt/j-1 is not the folder of step 1"),
        ("/", None, "/ is not the folder of step 1"),
    ],
)
def test_files_are_removed_only_from_the_committed_step_folder(
    candidate: str, manifest: str | None, why: str
) -> None:
    task = delete(1, "retention: x", at=candidate)

    assert keep_files_because(task, manifest) == why


@pytest.mark.parametrize(
    ("candidate", "step", "ok"),
    [
        ("/ckpt/j-1/step-000000000042", 42, True),
        ("/ckpt/j-1/step-000000000042/", 42, True),
        ("/ckpt/j-1/step-000000000043", 42, False),
        ("/ckpt/j-1", 42, False),
        ("/", 42, False),
        ("ckpt/j-1/step-000000000042", 42, False),
        ("/ckpt/j-1/step-42", 42, False),
    ],
)
def test_only_a_step_folder_may_be_removed(candidate: str, step: int, ok: bool) -> None:
    assert is_step_folder(candidate, step) is ok
