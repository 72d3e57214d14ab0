"""The preemption service's view of an eviction: begun, overdue once, ended with its cost."""

from __future__ import annotations

import random
from collections.abc import Iterator

from test_gang_resize import Log, elastic_running, node, submit

from rallypoint.control.eviction import Eviction, Key, review
from rallypoint.events import (
    Event,
    GangBound,
    JobCompleted,
    JobPreempted,
    JobStarted,
    LeaderEpochStarted,
    PreemptionRequested,
    TaskPlacement,
)
from rallypoint.runtime.changes import ChangeSet
from rallypoint.state import ClusterState


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


def _request(job_id: str, attempt: int, now: float) -> PreemptionRequested:
    return PreemptionRequested(
        job_id=job_id, role="scheduler", attempt=attempt, for_job="x", reason="priority", epoch=1,
        computed_at_seq=0, policy_version="p", now=now, at=now,
    )  # fmt: skip


def _random_history(rng: random.Random) -> Iterator[Event]:
    """Gangs on their own nodes bound, started, asked to stop, preempted (requeued), bound again,
    completed or cancelled, in a random interleaving."""
    yield LeaderEpochStarted(epoch=1, leader_id="s", at=1.0)
    jobs = [f"j{k}" for k in range(8)]
    for k, job_id in enumerate(jobs):
        yield node(f"n{k}")
        yield submit(job_id, "best-effort")
    attempts = dict.fromkeys(jobs, 0)
    phase = dict.fromkeys(jobs, "pending")
    for step in range(300):
        now = 20.0 + step
        k = rng.randrange(len(jobs))
        job_id = jobs[k]
        if phase[job_id] == "pending":
            attempts[job_id] += 1
            placement = TaskPlacement(task=0, node_id=f"n{k}", gpus=tuple(range(8)))
            yield GangBound(
                job_id=job_id, attempt=attempts[job_id], epoch=1, placements=(placement,), computed_at_seq=0,
                policy_version="p", now=now, at=now,
            )  # fmt: skip
            yield JobStarted(job_id=job_id, attempt=attempts[job_id], at=now)
            phase[job_id] = "running"
        elif phase[job_id] == "running" and rng.random() < 0.9:
            yield _request(job_id, attempts[job_id], now)
            phase[job_id] = "stopping"
        elif phase[job_id] == "stopping":
            attempt = attempts[job_id]
            yield JobPreempted(
                job_id=job_id, attempt=attempt, for_job="x", reason="priority", lost_gpu_s=8.0, at=now
            )
            phase[job_id] = "pending"
        elif phase[job_id] == "running":
            yield JobCompleted(job_id=job_id, attempt=attempts[job_id], at=now)
            phase[job_id] = "done"


def test_a_review_of_the_touched_jobs_says_what_a_review_of_every_job_says() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        state = ClusterState()
        feed = ChangeSet()
        full: dict[Key, Eviction] = {}
        incremental: dict[Key, Eviction] = {}
        reviews = began = ended = 0
        for seq, event in enumerate(_random_history(rng), 1):
            feed.add(state.apply(seq, event))
            if rng.random() < 0.3:
                now = 1000.0 + seq
                changes = feed.take()
                by_all = review(state, full, set(), now, overdue_after_s=50.0)
                by_touched = review(
                    state, incremental, set(), now, overdue_after_s=50.0,
                    touched=None if changes.everything else changes.jobs,
                )  # fmt: skip
                assert by_touched == by_all, (seed, seq)
                full, incremental = by_all.open, by_touched.open
                reviews += 1
                began += len(by_all.began)
                ended += len(by_all.ended)
        assert reviews > 20 and began > 5 and ended > 5, (reviews, began, ended)
