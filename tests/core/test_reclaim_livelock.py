"""Regression: a reclaim must not livelock (the A/B/C pattern of docs/simulator.md), and a guarantee covers
an elastic gang's minimum.

Queue ``a`` is within its nominal quota but its elastic gang C asks for more than it has left; queue
``b`` borrows. C used to reclaim A for its 4-GPU minimum while ordered in tier 1 (its 8 requested GPUs do
not fit ``a``'s nominal), behind the borrowers (less work left): A came back first into the freed GPUs,
C reclaimed B, B came back first, and so on, at every cycle. The order's tier and reclaim now both
measure C's minimum (``guaranteed_gpus``): C is in tier 0 and binds into what it reclaimed. The driver
below applies each cycle's decisions as the simulator does (a victim stops at once and waits again) and
runs the core again at the same instant while it preempts, then lets time pass.
"""

from __future__ import annotations

from collections import Counter

import msgspec

from rallypoint.core import (
    ClusterModel,
    Decisions,
    PendingJob,
    Queue,
    Quota,
    RunningJob,
    Snapshot,
    policy_by_name,
    schedule,
)

from .builders import cluster, nodes, pending, running

QUEUES = (
    Queue(name="a", cohort="org", quotas=(Quota(nominal=8),)),
    Queue(name="b", cohort="org", quotas=(Quota(nominal=8),)),
)
CYCLES_PER_INSTANT = 32  # as the simulator's max_cycles_per_instant


class World:
    """Running gangs and waiting jobs, changed only by the core's decisions and by gangs ending."""

    def __init__(self, model: ClusterModel, waiting: list[PendingJob]) -> None:
        self.model = model
        self.specs = {j.id: j for j in waiting}  # what a job asks for whenever it waits (again)
        self.waiting = dict(self.specs)
        self.reclaims: Counter[tuple[str, str]] = Counter()
        self.bound_at: dict[str, float] = {}

    def apply(self, d: Decisions, now: float) -> None:
        for p in d.preemptions:
            gone = self.model.unbind(p.victim_id)
            if p.reason == "reclaim":
                self.reclaims[(p.victim_id, p.for_job)] += 1
            self.waiting[gone.id] = msgspec.structs.replace(self.specs[gone.id], last_preempted_at=now)
        for b in d.binds:
            job = self.waiting.pop(b.job_id)
            limit = job.time_limit_s
            self.model.bind(
                RunningJob(
                    id=job.id,
                    team=job.team,
                    priority_class=job.priority_class,
                    gpus=b.gpus,
                    placements=b.placements,
                    start_time=now,
                    expected_end=now + limit if limit is not None else None,
                    min_gpus=job.min_gpus,
                    max_gpus=job.max_gpus,
                    gpu_step=job.gpu_step,
                    gpus_per_task=job.gpus_per_task,
                )
            )
            self.bound_at[job.id] = now

    def instant(self, now: float) -> None:
        """Cycles at ``now`` until one stops no victim (the simulator's follow-up cycles)."""
        policy = policy_by_name("rallypoint")
        for _ in range(CYCLES_PER_INSTANT):
            snap = Snapshot(now=now, cluster=self.model, pending=tuple(self.waiting.values()), queues=QUEUES)
            d = schedule(snap, policy)
            self.apply(d, now)
            if not d.preemptions:
                return

    def end(self, job_id: str) -> None:
        self.model.unbind(job_id)


# how the borrowers of b ask for GPUs whenever they wait: short jobs, less work left than C
A_SPEC = pending("A", 4, gpt=4, submit=80.0, team="b", time_limit_s=100.0)
B_SPEC = pending("B", 4, gpt=4, submit=90.0, team="b", time_limit_s=60.0)


def two_nodes(*extra: RunningJob) -> ClusterModel:
    """s0r0n0: x (a, 2 GPUs) and y (b, 6 GPUs, not preemptible); s0r0n1: A (b, 4 GPUs) and ``extra``."""
    return cluster(
        nodes(racks=1, per_rack=2),
        [
            running("x", {"s0r0n0": (0, 1)}, team="a"),
            running("y", {"s0r0n0": (2, 3, 4, 5, 6, 7)}, team="b", preemptible=False),
            running("A", {"s0r0n1": (0, 1, 2, 3)}, team="b", expected_end=200.0, gpus_per_task=4),
            *extra,
        ],
    )


def elastic_c(gpus: int) -> PendingJob:
    """a's long elastic gang: ``gpus`` asked, 4 at least (a has 6 GPUs of its nominal left)."""
    return pending(
        "C", gpus, gpt=4, submit=95.0, team="a", time_limit_s=3600.0, min_gpus=4, max_gpus=8, gpu_step=4
    )


def b_running() -> RunningJob:
    """b's second borrower, running beside A: node s0r0n1 is full."""
    return running("B", {"s0r0n1": (4, 5, 6, 7)}, team="b", expected_end=150.0, gpus_per_task=4)


def test_an_elastic_gang_reclaims_for_its_minimum_once_and_binds() -> None:
    # C asks for 8 GPUs, more than a has left of its nominal (6), but its minimum (4) fits: it is in tier
    # 0, ahead of b's borrowers, so the one borrower reclaimed for it does not come back into its GPUs
    # (before the fix: 32 reclaims at this instant, C never bound; after the first fix, no reclaim at all)
    w = World(two_nodes(b_running()), [elastic_c(8)])
    w.specs.update(A=A_SPEC, B=B_SPEC)
    for now in (100.0, 101.0, 102.0):
        w.instant(now)
    assert sum(w.reclaims.values()) == 1, w.reclaims
    assert w.bound_at == {"C": 100.0}
    assert w.model.running["C"].gpus == 4, "bound at its minimum: the rest would be borrowed"


def test_free_gpus_go_to_a_guaranteed_minimum_before_borrowers() -> None:
    w = World(two_nodes(), [B_SPEC, elastic_c(8)])
    w.specs["A"] = A_SPEC
    w.instant(100.0)
    # s0r0n1's 4 free GPUs: C's minimum is within a's nominal (tier 0), B borrows (tier 1)
    assert w.bound_at == {"C": 100.0} and not w.reclaims
    w.end("A")
    w.instant(200.0)
    assert w.bound_at.get("B") == 200.0 and not w.reclaims


def test_a_job_whose_minimum_is_beyond_its_guarantee_reclaims_nothing() -> None:
    # 8 GPUs at least, 6 left of a's nominal: C would borrow, so it waits in tier 1 behind the borrowers
    # it would evict (their GPUs would go back to them): no reclaim, a fruitless preemption
    c = pending("C", 8, gpt=4, submit=95.0, team="a", time_limit_s=3600.0)
    w = World(two_nodes(b_running()), [c])
    w.specs.update(A=A_SPEC, B=B_SPEC)
    w.instant(100.0)
    assert not w.reclaims and "C" not in w.bound_at


def test_a_reclaim_for_a_job_in_tier_0_binds_it_at_once() -> None:
    # B already runs beside A and C asks for 4 GPUs, which fit a's nominal: C is ordered before b's
    # borrowers, so the one borrower reclaimed for it does not come back into its GPUs
    w = World(two_nodes(b_running()), [elastic_c(4)])
    w.specs.update(A=A_SPEC, B=B_SPEC)
    w.instant(100.0)
    assert sum(w.reclaims.values()) == 1, w.reclaims
    assert w.bound_at == {"C": 100.0}
