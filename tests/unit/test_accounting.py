"""Given/when/then tests of accounting: every attempt is kept, and usage is GPUs x run time per attempt."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from rallypoint.accounting import finished_jobs, fold_attempts, queues_report, usage
from rallypoint.accounting.attempts import AttemptLedger
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobAttemptFailed,
    JobCompleted,
    JobFailed,
    JobPending,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    PreemptionRequested,
    RankExited,
    TaskPlacement,
    decode,
    encode,
)
from rallypoint.jobs.history import job_history
from rallypoint.scheduling.queues import Queues, Team

HISTORY = Path(__file__).parents[1] / "replay" / "data" / "history.jsonl"


def node(node_id: str, gpus: int = 8) -> NodeRegistered:
    infos = tuple(
        GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(gpus)
    )
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="r0",
        gpu_type="sim",
        gpus=infos,
        cpu_milli=1000,
        memory_mib=1000,
        agent_instance="a",
        at=0.0,
    )


def submit(job_id: str, gpus: int, team: str = "nlp", priority: str = "training-standard") -> JobSubmitted:
    spec = JobSpec(
        name=job_id,
        team=team,
        gpus=gpus,
        gpus_per_task=gpus,
        ranks_per_task=1,
        command=("true",),
        priority=priority,
        max_retries=1,
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)


def bind(job_id: str, attempt: int, at: float, gpus: tuple[int, ...], epoch: int = 1) -> GangBound:
    return GangBound(
        job_id=job_id,
        attempt=attempt,
        epoch=epoch,
        placements=(TaskPlacement(task=0, node_id="n1", gpus=gpus),),
        computed_at_seq=0,
        policy_version="t",
        now=at,
        at=at,
    )


LEADERS: tuple[Event, ...] = (
    node("n1"),
    LeaderEpochStarted(epoch=1, leader_id="s", at=0.0),
    LeaderEpochStarted(epoch=1, leader_id="p", role="preemption", at=0.0),
)


def seqd(*events: Event) -> list[tuple[int, Event]]:
    # Round-trip through the wire format: accounting must work on what the log stores.
    return [(i, decode(encode(e))) for i, e in enumerate((*LEADERS, *events), start=1)]


def preempted_then_completed() -> list[tuple[int, Event]]:
    return seqd(
        submit("low", 4, team="cv", priority="best-effort"),
        bind("low", 1, 10.0, (0, 1, 2, 3)),
        JobStarted(job_id="low", attempt=1, at=11.0),
        PreemptionRequested(
            job_id="low", attempt=1, for_job="high", reason="priority", epoch=1, computed_at_seq=1,
            policy_version="t", now=20.0, at=20.0,
        ),
        JobPreempted(job_id="low", attempt=1, for_job="high", reason="priority", lost_gpu_s=6.5, at=21.5),
        JobPending(job_id="low", code="Resources", message="none", epoch=1, computed_at_seq=1, at=25.0),
        bind("low", 2, 30.0, (4, 5, 6, 7)),
        JobStarted(job_id="low", attempt=2, resume_step=7, at=31.0),
        JobCompleted(job_id="low", attempt=2, at=41.0),
    )  # fmt: skip


def retried_then_failed() -> list[tuple[int, Event]]:
    return seqd(
        submit("flaky", 2),
        bind("flaky", 1, 5.0, (0, 1)),
        JobStarted(job_id="flaky", attempt=1, at=5.0),
        JobAttemptFailed(
            job_id="flaky", attempt=1, cause="user", reason="rank 0 exited 3", exit_code=3, retry_at=9.0,
            at=8.0,
        ),
        bind("flaky", 2, 9.0, (0, 1)),
        JobStarted(job_id="flaky", attempt=2, at=10.0),
        JobFailed(job_id="flaky", attempt=2, reason="rank 0 exited 3", exit_code=3, at=12.0),
    )  # fmt: skip


def test_a_preempted_job_keeps_both_attempts() -> None:
    state, ledger = fold_attempts(preempted_then_completed())
    first, second = ledger.of("low")
    assert (first.outcome, first.preempted_for, first.lost_gpu_s) == ("preempted", "high", 6.5)
    assert (first.started_at, first.ended_at, first.nodes) == (11.0, 21.5, ["n1"])
    assert (second.outcome, second.resume_step, second.placements[0].gpus) == ("completed", 7, (4, 5, 6, 7))
    # the fold's own service of the preempted attempt is the ledger's charge for it
    assert state.jobs["low"].attained_gpu_s == 4 * (21.5 - 11.0)


def test_usage_is_gpus_times_run_time_over_every_attempt() -> None:
    _, ledger = fold_attempts([*preempted_then_completed(), *retried_then_failed()[len(LEADERS) :]])
    report = usage(ledger.records(), "team", None, None, now=100.0, price_per_gpu_hour=3.6)
    rows = {r.key: r for r in report.rows}
    assert rows["cv"].gpu_s == 4 * 10.5 + 4 * 10.0
    assert rows["nlp"].gpu_s == 2 * 3.0 + 2 * 2.0
    assert (rows["cv"].attempts, rows["cv"].jobs, rows["cv"].lost_gpu_s) == (2, 1, 6.5)
    assert rows["cv"].cost == pytest.approx(82.0 / 3600 * 3.6)
    assert report.total_gpu_s == 82.0 + 10.0
    by_class = {r.key: r.gpu_s for r in usage(ledger.records(), "class", None, None, now=100.0).rows}
    assert by_class == {"best-effort": 82.0, "training-standard": 10.0}


def test_the_window_clips_attempts_and_books_lost_work_when_it_was_lost() -> None:
    _, ledger = fold_attempts(preempted_then_completed())
    report = usage(ledger.records(), "team", 20.0, 35.0, now=100.0)
    (row,) = report.rows
    assert row.gpu_s == 4 * 1.5 + 4 * 4.0
    assert row.lost_gpu_s == 6.5
    assert usage(ledger.records(), "team", 22.0, 35.0, now=100.0).rows[0].lost_gpu_s == 0.0


def test_a_running_attempt_is_charged_up_to_now() -> None:
    _, ledger = fold_attempts(preempted_then_completed()[:-1])
    report = usage(ledger.records(), "team", None, None, now=36.0)
    assert report.rows[0].gpu_s == 4 * 10.5 + 4 * 5.0
    assert ledger.of("low")[-1].outcome == "running"


def test_retries_are_attempts_of_their_own() -> None:
    state, ledger = fold_attempts(retried_then_failed())
    assert [(a.attempt, a.outcome, a.exit_code) for a in ledger.of("flaky")] == [
        (1, "attempt-failed", 3),
        (2, "failed", 3),
    ]
    (row,) = finished_jobs(state, ledger)
    assert (row.state, row.attempts, row.run_s, row.gpu_s) == ("failed", 2, 5.0, 10.0)
    assert row.queue_s == (12.0 - 1.0) - 5.0
    assert finished_jobs(state, ledger, team="cv") == []
    assert finished_jobs(state, ledger, states={"completed"}) == []
    assert finished_jobs(state, ledger, since=12.5) == []


def two_ranks_exit(job_id: str, attempt: int, first: tuple[int, int], then: tuple[int, int]) -> list[Event]:
    """Rank ``first[0]`` exits ``first[1]``, then rank ``then[0]`` exits ``then[1]`` (stopped after it)."""
    return [
        RankExited(job_id=job_id, attempt=attempt, rank=rank, node_id="n1", exit_code=code, at=6.0 + i)
        for i, (rank, code) in enumerate((first, then))
    ]


def test_the_rank_whose_exit_failed_an_attempt_is_kept_and_no_other() -> None:
    flaky = [event for _, event in retried_then_failed()[len(LEADERS) :]]
    events = seqd(
        *flaky[:3],
        # rank 1 fails, rank 0 is stopped after it: the first non-zero exit in the log is the failing rank
        *two_ranks_exit("flaky", 1, (1, 3), (0, -15)),
        flaky[3],
        flaky[4],
        flaky[5],
        *two_ranks_exit("flaky", 2, (0, 3), (1, -15)),
        flaky[6],
        # a later exit of an ended attempt changes nothing
        *two_ranks_exit("flaky", 2, (1, 9), (1, 9)),
    )
    _, ledger = fold_attempts(events)
    assert [(a.attempt, a.failed_rank) for a in ledger.of("flaky")] == [(1, 1), (2, 0)]


def test_a_rank_stopped_by_a_preemption_or_a_time_limit_failed_nothing() -> None:
    low = [event for _, event in preempted_then_completed()[len(LEADERS) :]]
    limited = [
        submit("slow", 2),
        bind("slow", 1, 5.0, (4, 5)),
        JobStarted(job_id="slow", attempt=1, at=5.0),
        *two_ranks_exit("slow", 1, (0, -15), (1, -15)),
        JobFailed(job_id="slow", attempt=1, reason="time limit of 1 s exceeded", at=9.0),
    ]
    preempted = [*low[:4], *two_ranks_exit("low", 1, (0, 143), (1, 143)), *low[4:]]
    running = [*low[:3], RankExited(job_id="low", attempt=1, rank=2, node_id="n1", exit_code=1, at=12.0)]
    _, ledger = fold_attempts(seqd(*preempted, *limited))
    assert [a.failed_rank for a in ledger.of("low")] == [None, None]
    assert [a.failed_rank for a in ledger.of("slow")] == [None]
    # while its gang is being stopped, the attempt already names the rank that failed it
    _, ledger = fold_attempts(seqd(*running))
    assert ledger.of("low")[0].failed_rank == 2


def test_a_stale_leaders_bind_opens_no_attempt() -> None:
    events = seqd(submit("j", 2), bind("j", 1, 5.0, (0, 1), epoch=7))
    _, ledger = fold_attempts(events)
    assert ledger.of("j") == []
    history = job_history(events, "j")
    assert history is not None
    assert [(t.type, t.applied) for t in history.timeline] == [
        ("JobSubmitted.v1", True),
        ("GangBound.v1", False),
    ]


def test_job_history_tells_reasons_preemptions_and_recovery() -> None:
    events = preempted_then_completed()
    history = job_history(events, "low")
    assert history is not None
    assert history.state == "completed" and len(history.attempts) == 2
    assert [(r.code, r.at) for r in history.reasons] == [("Resources", 25.0)]
    (preemption,) = history.preemptions
    assert (preemption.for_job, preemption.reason, preemption.requested_at, preemption.preempted_at) == (
        "high",
        "priority",
        20.0,
        21.5,
    )
    flaky = job_history(retried_then_failed(), "flaky")
    assert flaky is not None
    assert [(s.kind, s.attempt, s.reason) for s in flaky.recovery] == [
        ("attempt-failed", 1, "rank 0 exited 3")
    ]
    assert job_history(events, "nobody") is None
    # the JSON shape the API serves
    assert set(json.loads(msgspec.json.encode(history))) >= {"spec", "attempts", "reasons", "checkpoints"}


def test_queues_show_quota_use_and_borrowing() -> None:
    state, _ = fold_attempts([*preempted_then_completed()[:-1], (20, submit("wait", 8))])
    bare = queues_report(state, None)
    assert not bare.quotas
    assert [(t.team, t.used, t.pending_jobs, t.nominal) for t in bare.teams] == [
        ("cv", 4, 0, None),
        ("nlp", 0, 1, None),
    ]
    queues = Queues(
        teams=[Team(name="cv", nominal=2, cohort="all"), Team(name="nlp", nominal=6, cohort="all")]
    )
    report = queues_report(state, queues)
    assert [(t.team, t.nominal, t.borrowed, t.pending_gpus) for t in report.teams] == [
        ("cv", 2, 2, 0),
        ("nlp", 6, 0, 8),
    ]
    assert [(c.cohort, c.nominal, c.used, c.borrowed) for c in report.cohorts] == [("all", 8, 4, 2)]


def test_queues_count_a_share_or_a_slice_for_its_part_of_a_gpu() -> None:
    def part(job_id: str, **kw: object) -> JobSubmitted:
        base = submit(job_id, 1)
        return msgspec.structs.replace(base, spec=msgspec.structs.replace(base.spec, **kw))

    state, _ = fold_attempts(
        seqd(
            part("nb1", gpu_milli=250),
            bind("nb1", 1, 10.0, (0,)),
            part("nb2", gpu_milli=250),
            bind("nb2", 1, 11.0, (0,)),
            part("eval", mig_profile="1g.10gb"),
        )
    )
    report = queues_report(state, Queues(teams=[Team(name="nlp", nominal=1, cohort="all")]))
    (row,) = report.teams
    assert (row.used, row.borrowed, row.running_jobs, row.pending_jobs, row.pending_gpus) == (
        0.5,
        0,
        2,
        1,
        0.142,
    )
    assert [(c.used, c.pending_gpus) for c in report.cohorts] == [(0.5, 0.142)]


def recorded() -> list[tuple[int, Event]]:
    out = []
    for line in HISTORY.read_text().splitlines():
        item = json.loads(line)
        out.append((item["seq"], msgspec.json.decode(json.dumps(item["event"]), type=Event)))
    return out


def test_on_the_recorded_history_attempts_match_the_fold() -> None:
    state, ledger = fold_attempts(recorded())
    for job in state.jobs.values():
        attempts = ledger.of(job.job_id)
        assert [a.attempt for a in attempts] == list(range(1, job.attempt + 1))
        ended_early = [a for a in attempts if a.outcome in ("preempted", "attempt-failed", "interrupted")]
        assert len([a for a in attempts if a.outcome == "preempted"]) == job.preemptions
        charged = sum((a.gpus * (a.ended_at - a.started_at) for a in ended_early if a.started_at), 0.0)
        assert charged == pytest.approx(job.attained_gpu_s)


def test_the_ledger_round_trips_through_msgpack() -> None:
    _, ledger = fold_attempts(preempted_then_completed())
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(ledger), type=AttemptLedger)
    assert list(again.records()) == list(ledger.records())
