"""Pending reasons name what binds (issue 31): GPUs that are not free before quota that could be
borrowed, each victim once, and a start bounded by the preemption grace rather than promised "in ~60 s".

Clusters of two 8-GPU nodes, queued and running jobs as data; the scheduling core is called directly.
"""

from __future__ import annotations

from rallypoint.core import (
    ClusterModel,
    Decisions,
    Node,
    PendingJob,
    PendingReason,
    Queue,
    Quota,
    RunningJob,
    Snapshot,
    TaskPlacement,
    policy_by_name,
    schedule,
)

NODES = ("n0", "n1")
ALL = tuple(range(8))


def two_nodes(*jobs: RunningJob) -> ClusterModel:
    cluster = ClusterModel([Node(id=n, rack="r0", gpu_type="h100", gpus=8) for n in NODES])
    for job in jobs:
        cluster.bind(job)
    return cluster


def running(job_id: str, team: str, tasks: list[tuple[str, tuple[int, ...]]], **kw: object) -> RunningJob:
    placements = tuple(TaskPlacement(task=i, node_id=n, gpus=g) for i, (n, g) in enumerate(tasks))
    gpus = sum(len(g) for _n, g in tasks)
    return RunningJob(id=job_id, team=team, gpus=gpus, placements=placements, start_time=0.0, **kw)  # type: ignore[arg-type]


def cohort(**nominals: int) -> tuple[Queue, ...]:
    return tuple(Queue(name=q, cohort="lab", quotas=(Quota(nominal=n),)) for q, n in nominals.items())


def decide(cluster: ClusterModel, pending: list[PendingJob], queues: tuple[Queue, ...] = ()) -> Decisions:
    snapshot = Snapshot(now=1000.0, cluster=cluster, pending=tuple(pending), queues=queues)
    return schedule(snapshot, policy_by_name("rallypoint"))


def reason_of(decisions: Decisions, job_id: str) -> PendingReason:
    (reason,) = [r for r in decisions.pending if r.job_id == job_id]
    return reason


# --- GPUs before quota ----------------------------------------------------------------------------


def test_a_job_short_of_free_gpus_is_told_so_even_when_its_quota_is_short_too() -> None:
    # the case: queue a borrows 7 and holds 15 of 16 GPUs; one is free and its job asks for 2.
    # The quota refuses (it would borrow 9, the cohort lends 8), but two free GPUs are what it lacks first
    hog = running("hog", "a", [("n0", ALL), ("n1", (0, 1, 2, 3, 4, 5, 6))], preemptible=False)
    job = PendingJob(id="j", team="a", gpus=2, gpus_per_task=2, submit_time=0)
    decisions = decide(two_nodes(hog), [job], cohort(a=8, b=8))
    reason = reason_of(decisions, "j")
    assert reason.code == "Resources", reason
    assert reason.message.startswith("needs 2 GPUs in the cluster; 1 free; its quota is short too: ")
    assert "queue a uses 15 of 8 nominal h100 GPUs; needs 2; cohort can lend 8" in reason.message


def test_quota_alone_is_named_when_the_gpus_are_free() -> None:
    # 8 GPUs free, queue a at its nominal with nothing to borrow: the quota is the one blocker
    mine = running("mine", "a", [("n0", ALL)])
    queues = (Queue(name="a", quotas=(Quota(nominal=8, borrowing_limit=0),)),)
    job = PendingJob(id="j", team="a", gpus=4, gpus_per_task=4, submit_time=0)
    decisions = decide(two_nodes(mine), [job], queues)
    assert reason_of(decisions, "j").code == "QuotaExceeded"


def test_a_job_its_quota_can_never_hold_says_so_whatever_is_free() -> None:
    # queue a may never hold more than 8 (no cohort): GPUs freeing up would not help, so that is the reason
    other = running("other", "z", [("n0", ALL), ("n1", (0, 1, 2, 3))])
    queues = (Queue(name="a", quotas=(Quota(nominal=8),)),)
    decisions = decide(two_nodes(other), [PendingJob(id="j", team="a", gpus=16, submit_time=0)], queues)
    reason = reason_of(decisions, "j")
    assert reason.code == "QuotaExceeded" and "never fits its quota" in reason.message, reason


def test_a_job_waiting_on_its_quota_still_lets_an_elastic_gang_grow() -> None:
    # b's gang (8 of 8..16) may grow into the idle node; a's 16-GPU job is short of GPUs and of quota. Its
    # reason now names the GPUs, yet the growth is decided as before: a job its quota refuses could not
    # take the idle GPUs anyway
    gang = running("gang", "b", [("n0", ALL)], min_gpus=8, max_gpus=16, gpus_per_task=8)
    job = PendingJob(id="j", team="a", gpus=16, submit_time=0)
    decisions = decide(two_nodes(gang), [job], cohort(a=4, b=12))
    reason = reason_of(decisions, "j")
    assert reason.code == "Resources" and "its quota is short too" in reason.message, reason
    assert [(r.job_id, r.gpus) for r in decisions.resizes] == [("gang", 16)]


# --- preemption: each victim once, a bounded start ------------------------------------------------


def test_an_elastic_gang_shrunk_by_several_tasks_is_named_once() -> None:
    # a 16-GPU gang of four 4-GPU tasks gives two of them back for an 8-GPU production job: two shrink
    # candidates of one job, which the reason used to list twice ("preempting 2 jobs (gang, gang)")
    tasks = [("n0", (0, 1, 2, 3)), ("n0", (4, 5, 6, 7)), ("n1", (0, 1, 2, 3)), ("n1", (4, 5, 6, 7))]
    gang = running("gang", "t", tasks, min_gpus=4, max_gpus=16, gpus_per_task=4, priority_class="best-effort")
    prod = PendingJob(id="prod", team="t", gpus=8, submit_time=0, priority_class="production")
    decisions = decide(two_nodes(gang), [prod])
    reason = reason_of(decisions, "prod")
    assert reason.code == "Preempting", reason
    assert [(r.job_id, r.gpus) for r in decisions.resizes] == [("gang", 8)]
    assert "shrinking 1 elastic job (gang);" in reason.message, reason.message
    assert reason.message.count("gang") == 1


def test_a_preemptor_is_promised_a_bound_not_a_time() -> None:
    victim = running("victim", "t", [("n0", ALL), ("n1", ALL)], priority_class="best-effort")
    prod = PendingJob(id="prod", team="t", gpus=8, submit_time=0, priority_class="production")
    decisions = decide(two_nodes(victim), [prod])
    reason = reason_of(decisions, "prod")
    assert reason.code == "Preempting" and [p.victim_id for p in decisions.preemptions] == ["victim"]
    assert "preempting 1 job (victim); starts once they have stopped, within 60 s (the preemption grace)" in (
        reason.message
    )
    assert "start in ~" not in reason.message
