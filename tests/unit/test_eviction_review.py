"""The preemption service's view of an eviction: begun, overdue once, ended with its cost."""

from __future__ import annotations

from test_gang_resize import Log, elastic_running

from rallypoint.control.eviction import review
from rallypoint.events import JobPreempted, PreemptionRequested


def test_an_eviction_begins_is_overdue_once_and_ends_with_the_work_it_lost() -> None:
    log = Log()
    elastic_running(log)  # "el" runs on 16 GPUs (epoch 1)
    request = PreemptionRequested(
        job_id="el",
        role="scheduler",
        attempt=1,
        for_job="x",
        reason="priority",
        epoch=1,
        computed_at_seq=log.state.last_seq,
        policy_version="p",
        now=log.now,
        at=log.now,
    )
    log.append(request)
    seen = review(log.state, {}, set(), 100.0, overdue_after_s=40.0)
    assert [(e.job_id, e.gpus, e.for_job) for e in seen.began] == [("el", 16, "x")]
    assert seen.overdue == [] and seen.ended == []
    later = review(log.state, seen.open, set(), 141.0, overdue_after_s=40.0)
    assert later.began == [] and [e.job_id for e in later.overdue] == ["el"]
    assert review(log.state, later.open, {("el", 1)}, 150.0, overdue_after_s=40.0).overdue == []

    log.append(
        JobPreempted(job_id="el", attempt=1, for_job="x", reason="priority", lost_gpu_s=320.0, at=150.0)
    )
    (ended,) = review(log.state, later.open, {("el", 1)}, 151.0, overdue_after_s=40.0).ended
    assert (ended.outcome, ended.took_s, ended.lost_gpu_s) == ("pending", 51.0, 320.0)
