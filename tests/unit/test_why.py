"""`rally why JOB` (issue 31, Build item 6): the core's numbers behind a reason, the reason history as
spans, and the table a person reads (a ``Predicted start:`` line only when the cluster predicts one).

The numbers are checked against the scheduler's own decision on the same snapshot: what ``explain`` says
is short is what the cycle's reason names, and where it says the job fits, the cycle binds it.
"""

from __future__ import annotations

import pytest
from rallypoint_services.api.why import reason_spans

# the same two-node clusters as the pending-reason tests (pytest puts this folder on the import path)
from test_pending_reason import ALL, cohort, running, two_nodes

from rallypoint.accounting.attempts import AttemptRecord
from rallypoint.cli.main import main
from rallypoint.cli.why_cmds import format_why
from rallypoint.core import PendingJob, Queue, Quota, Snapshot, policy_by_name, schedule
from rallypoint.core.explain import Explanation, explain
from rallypoint.jobs.history import ReasonChange

RALLYPOINT = policy_by_name("rallypoint")


def explained(snapshot: Snapshot, job: PendingJob) -> Explanation:
    return explain(snapshot, job, RALLYPOINT.config)


# --- the numbers ------------------------------------------------------------------------------------


def test_the_issues_job_lacks_one_free_gpu_and_one_gpu_of_quota_room() -> None:
    hog = running("hog", "a", [("n0", ALL), ("n1", (0, 1, 2, 3, 4, 5, 6))], preemptible=False)
    job = PendingJob(id="j", team="a", gpus=2, gpus_per_task=2, submit_time=0)
    snapshot = Snapshot(now=1000.0, cluster=two_nodes(hog), pending=(job,), queues=cohort(a=8, b=8))
    why = explained(snapshot, job)
    (room,) = why.gpus
    assert (room.gpu_type, room.free, room.schedulable, room.short, room.fits) == ("h100", 1, 16, 1, False)
    (quota,) = why.quotas
    assert (quota.used, quota.nominal, quota.borrowing_limit, quota.cohort_lendable) == (15, 8, None, 8)
    assert (quota.room, quota.short, quota.ceiling) == (1, 1, 16)
    assert why.would_start == (
        "1 more free h100 GPUs (it needs 2; 1 free)",
        "room for 1 more h100 GPUs in queue a's quota (it uses 15 of nominal 8; its cohort can lend 8)",
    )
    # the cycle on the same snapshot names the same blocker with the same numbers
    (reason,) = schedule(snapshot, RALLYPOINT).pending
    assert reason.code == "Resources" and "1 free" in reason.message and "cohort can lend 8" in reason.message


def test_an_elastic_job_is_asked_its_minimum_and_fits_when_that_does() -> None:
    # 8 GPUs free: the gang of 16 (min 8) starts at 8; explain says nothing is missing and the cycle binds it
    other = running("other", "z", [("n0", ALL)])
    job = PendingJob(id="e", team="t", gpus=16, min_gpus=8, max_gpus=16, gpus_per_task=8, submit_time=0)
    snapshot = Snapshot(now=1000.0, cluster=two_nodes(other), pending=(job,))
    why = explained(snapshot, job)
    assert why.asked == 8 and why.quotas == () and why.gpus[0].fits
    assert why.would_start[0].startswith("nothing it lacks: 8 h100 GPUs fit now")
    assert [b.gpus for b in schedule(snapshot, RALLYPOINT).binds] == [8]


def test_a_quota_that_can_never_hold_the_job_says_the_queue_file_must_change() -> None:
    job = PendingJob(id="j", team="a", gpus=16, submit_time=0)
    snapshot = Snapshot(
        now=1000.0, cluster=two_nodes(), pending=(job,), queues=(Queue(name="a", quotas=(Quota(nominal=8),)),)
    )
    why = explained(snapshot, job)
    assert why.gpus[0].short == 0 and why.quotas[0].short == 8
    assert why.would_start == (
        "a larger quota: queue a can never hold more than 8 h100 GPUs (nominal 8 + 0 its cohort could lend); "
        "the queue file must change",
    )


def test_an_org_cap_is_counted_in_the_room() -> None:
    queues = (
        Queue(name="lab", quotas=(Quota(nominal=4),)),
        Queue(name="a", parent="lab", cohort="c", quotas=(Quota(nominal=8),)),
    )
    mine = running("mine", "a", [("n0", (0, 1, 2))])
    job = PendingJob(id="j", team="a", gpus=2, gpus_per_task=2, submit_time=0)
    snapshot = Snapshot(now=1000.0, cluster=two_nodes(mine), pending=(job,), queues=queues)
    (quota,) = explained(snapshot, job).quotas
    assert [(o.org, o.used, o.cap) for o in quota.orgs] == [("lab", 3, 4)]
    assert (quota.room, quota.short) == (1, 1)
    assert schedule(snapshot, RALLYPOINT).pending[0].code == "QuotaExceeded"


def test_a_required_rack_is_measured_in_its_best_rack() -> None:
    other = running("other", "z", [("n0", (0, 1, 2, 3))])
    job = PendingJob(id="j", team="t", gpus=16, gpus_per_task=8, topology_required="rack", submit_time=0)
    snapshot = Snapshot(now=1000.0, cluster=two_nodes(other), pending=(job,))
    (room,) = explained(snapshot, job).gpus
    assert (room.level, room.free, room.best_free, room.short) == ("rack", 12, 12, 4)


# --- the history ------------------------------------------------------------------------------------


def change(at: float, code: str, message: str = "") -> ReasonChange:
    return ReasonChange(seq=int(at), at=at, code=code, message=message or code)


def attempt(bound_at: float) -> AttemptRecord:
    return AttemptRecord(
        job_id="j", attempt=1, team="t", user="u", priority="p", gpus=8, placements=(), bound_at=bound_at
    )


def test_reasons_become_spans_closed_by_the_next_code_a_bind_or_the_end() -> None:
    reasons = [
        change(10, "Priority"),
        change(20, "Resources", "2 free"),
        change(25, "Resources", "4 free"),
        change(40, "Resources", "after a preemption"),
    ]
    spans = reason_spans(reasons, [attempt(30.0)], None)
    got = [(s.code, s.since, s.until, s.ended_by, s.message, s.updates) for s in spans]
    assert got == [
        ("Priority", 10, 20, "reason", "Priority", 0),
        # the same code with new numbers is one span; the bind at 30 ends it
        ("Resources", 20, 30.0, "bound", "4 free", 1),
        # waiting again after the bind (a preemption): a new span, still the reason now
        ("Resources", 40, None, "", "after a preemption", 0),
    ]
    (cancelled,) = reason_spans([change(10, "Resources")], [], 50.0)
    assert (cancelled.until, cancelled.ended_by) == (50.0, "ended")


# --- the table --------------------------------------------------------------------------------------


def answer(predicted: float | None) -> dict[str, object]:
    return {
        "job_id": "j-1",
        "state": "pending",
        "reason": {
            "code": "Resources",
            "message": "needs 2 GPUs in the cluster; 1 free; 0 jobs ahead",
            "jobs_ahead": 0,
            "updated_at": 100.0,
        },
        "explanation": {
            "job_id": "j-1",
            "asked": 2,
            "gpus_per_task": 2,
            "gpus": [
                {
                    "gpu_type": "h100",
                    "free": 1,
                    "schedulable": 16,
                    "level": "cluster",
                    "best_free": 1,
                    "short": 1,
                    "fits": False,
                }
            ],
            "quotas": [],
            "would_start": ["1 more free h100 GPUs (it needs 2; 1 free)"],
        },
        "history": [
            {
                "code": "Resources",
                "message": "needs 2 GPUs",
                "since": 100.0,
                "until": None,
                "ended_by": "",
                "updates": 0,
            }
        ],
        "predicted_start": predicted,
        "seq": 7,
    }


def test_the_table_has_the_reason_its_numbers_what_would_start_it_and_the_history() -> None:
    text = format_why(answer(None), now=160.0)
    assert text.startswith("j-1 is pending: Resources, #1: needs 2 GPUs in the cluster; 1 free; 0 jobs ahead")
    assert "h100 GPUs" in text and "1 free of 16 schedulable" in text
    assert "What would let it start\n  - 1 more free h100 GPUs (it needs 2; 1 free)" in text
    assert "Reason history" in text and "1:00" in text
    assert "Predicted start" not in text  # no prediction (not pending, or no predictor): no line, no guess
    predicted = {"status": "predicted", "p50": 400.0, "p90": 700.0, "runtime_p50_s": 600.0}
    shown = format_why(answer({**predicted, "runtime_from": "team+name", "computed_at_seq": 7}), now=160.0)
    said = "Predicted start: in 4m (p90 9m); own runtime ~10m from team+name history, as of log seq 7"
    assert said in shown


def test_an_unreachable_api_is_one_line_and_a_non_zero_exit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["why", "j-000000000000", "--api-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the Rallypoint API") and "Traceback" not in err


def test_a_job_that_never_waited_has_no_reason_spans() -> None:
    """A job bound at its first cycle has no reason at all (schemathesis found a 500 here)."""
    assert reason_spans([], [attempt(30.0)], 90.0) == []
