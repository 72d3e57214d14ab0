"""The live scheduler's cycle compute against the pure core's, at the same size, in CPU time.

``rally bench scheduler`` times ``schedule()`` alone on a synthetic cluster (12,500 nodes x 8 GPUs, ~80%
full, thousands pending). This folds the same workload into a ``ClusterState`` (as the scheduler's
follower would: nodes registered, running gangs bound and started, pending jobs submitted) and times
what a live cycle computes on it: the model synced from what the fold touched since the last cycle, the
pending list, ``schedule()``, and the appends it turns into (``decision_writes``, ``admission_writes``).
Between cycles the cycle's own binds are folded back, a few gangs end and a few jobs arrive, as in a
running cluster. Times are CPU seconds of this process (``time.process_time``): other work on the
machine does not move them.

``python -m rallypoint.bench.cyclebench --json``; the ratio ``live_over_core`` is issue 15's
"live cycle compute <= 1.5x the core at the same size".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from rallypoint_services.scheduler.heap import settle_heap

from rallypoint.bench.corebench import build_workload
from rallypoint.core import ClusterModel, Decisions, PendingJob, Queue, RunningJob, schedule
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    subjects,
)
from rallypoint.runtime.changes import ChangeSet
from rallypoint.scheduling import SchedulingPolicy, admission_writes, build_snapshot, decision_writes
from rallypoint.state import ClusterState

__all__ = ["run_cycle_bench"]

_EPOCH = 1


class _Fold:
    """A ClusterState fed event by event, with the change feed a follower keeps beside it."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.feed = ChangeSet()
        self.seq = 0

    def apply(self, event: Event) -> None:
        self.seq += 1
        self.feed.add(self.state.apply(self.seq, event))


def _registered(node_id: str, rack: str, spine: str, gpu_type: str, gpus: int) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id, address="127.0.0.1", rack=rack, spine=spine, gpu_type=gpu_type,
        gpus=tuple(GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=1, nvlink_domain=0)
                   for g in range(gpus)),
        cpu_milli=192_000, memory_mib=2 << 20, agent_instance="bench", at=1.0,
    )  # fmt: skip


def _spec(name: str, team: str, priority: str, gpus: int, per_task: int, limit: float | None) -> JobSpec:
    return JobSpec(
        name=name, team=team, gpus=gpus, gpus_per_task=per_task, ranks_per_task=1, command=("true",),
        priority=priority, time_limit_s=int(limit) if limit is not None else None,
    )  # fmt: skip


def _running(fold: _Fold, job: RunningJob) -> None:
    limit = job.expected_end - job.start_time if job.expected_end is not None else None
    per_task = job.gpus_per_task if job.gpus_per_task is not None else job.gpus
    spec = _spec(job.id, job.team, job.priority_class, job.gpus, per_task, limit)
    fold.apply(JobSubmitted(job_id=job.id, spec=spec, submitted_at=job.start_time))
    fold.apply(_bound(fold, job.id, 1, job.placements, job.start_time))
    fold.apply(JobStarted(job_id=job.id, attempt=1, at=job.start_time))


def _bound(fold: _Fold, job_id: str, attempt: int, placements: Any, at: float) -> GangBound:
    return GangBound(
        job_id=job_id, attempt=attempt, epoch=_EPOCH, placements=placements, computed_at_seq=fold.seq,
        policy_version="bench", now=at, at=at,
    )  # fmt: skip


def _pending(fold: _Fold, job: PendingJob) -> None:
    per_task = job.gpus_per_task if job.gpus_per_task is not None else job.gpus
    spec = _spec(job.id, job.team, job.priority_class, job.gpus, per_task, job.time_limit_s)
    fold.apply(JobSubmitted(job_id=job.id, spec=spec, submitted_at=job.submit_time))


def _fold_workload(cluster: ClusterModel, pending: Sequence[PendingJob]) -> _Fold:
    fold = _Fold()
    fold.apply(LeaderEpochStarted(epoch=_EPOCH, leader_id="bench", role="scheduler", at=1.0))
    for node in cluster.nodes.values():
        fold.apply(_registered(node.id, node.rack, node.spine, node.gpu_type, node.gpus))
    for job in sorted(cluster.running.values(), key=lambda j: j.id):
        _running(fold, job)
    for waiting in pending:
        _pending(fold, waiting)
    return fold


def _between_cycles(
    fold: _Fold, binds: Sequence[GangBound], ended: int, arrivals: Sequence[PendingJob]
) -> None:
    """What the follower folds between two cycles: the cycle's binds, a few gangs ending, new jobs."""
    for event in binds:
        fold.apply(event)
    running = [j for j in fold.state.jobs.values() if j.state == "running"][:ended]
    for view in running:
        fold.apply(JobCompleted(job_id=view.job_id, attempt=view.attempt, at=view.started_at or 1.0))
    for job in arrivals:
        _pending(fold, job)


def _new_jobs(template: Sequence[PendingJob], cycle: int, count: int) -> list[PendingJob]:
    """``count`` new jobs shaped as the workload's pending ones."""
    picked = template[cycle * count % len(template) :][:count]
    return [msgspec.structs.replace(j, id=f"new{cycle:03d}-{k}") for k, j in enumerate(picked)]


class _Cycle:
    """One cycle measured three ways on the same fold: live (the scheduler's), with a model compared in
    full (as before the change feed was used) and the core alone. CPU seconds."""

    def __init__(self, fold: _Fold, policy: SchedulingPolicy, queues: Sequence[Queue], now: float) -> None:
        self.fold, self.policy, self.queues, self.now = fold, policy, queues, now

    def live(self) -> tuple[float, Decisions, list[GangBound]]:
        state, now = self.fold.state, self.now
        start = time.process_time()
        decisions = self.policy.decide_live(state, now, changed=self.fold.feed.take())
        writes = [
            *decision_writes(decisions, state, epoch=_EPOCH, policy_version=self.policy.version, at=now),
            *admission_writes(state, at=now),
        ]
        spent = time.process_time() - start
        binds = [e for w in writes for e in subjects.members(w.event) if isinstance(e, GangBound)]
        return spent, decisions, binds

    def full_compare(self) -> float:
        full = SchedulingPolicy("rallypoint", queues=self.queues)
        full.decide_live(self.fold.state, self.now)  # its first sync builds the model
        start = time.process_time()
        full.decide_live(self.fold.state, self.now)
        return time.process_time() - start

    def core(self) -> tuple[float, Decisions]:
        snapshot = build_snapshot(self.fold.state, self.now, queues=self.queues)
        snapshot.cluster.index()  # as ``rally bench scheduler``: the index is the model's, kept across cycles
        start = time.process_time()
        decisions = schedule(snapshot, self.policy.policy)
        return time.process_time() - start, decisions


def run_cycle_bench(
    *,
    nodes: int = 12_500,
    gpus_per_node: int = 8,
    pending: int = 2_500,
    cycles: int = 10,
    churn: int = 100,
    seed: int = 1,
    settle: bool = True,
) -> dict[str, Any]:
    """CPU ms per cycle: the live cycle (sync from the touched ids, pending, decide, writes) and the core
    alone on the same snapshot. Between two cycles the binds are folded, and as many running gangs end and
    new jobs arrive as were bound, at least ``churn``."""
    cluster, waiting, queues, now = build_workload(nodes, gpus_per_node, pending, seed)
    fold = _fold_workload(cluster, waiting)
    if settle:  # as the scheduler service does once its fold has caught up (process-wide: off in tests)
        settle_heap()
    measure = _Cycle(fold, SchedulingPolicy("rallypoint", queues=queues), queues, now)
    live_ms: list[float] = []
    full_ms: list[float] = []
    core_ms: list[float] = []
    binds = differ = 0
    for cycle in range(cycles + 1):
        spent, decided, bound = measure.live()
        if cycle > 0:  # the first is the leader's first: a full sync, as the core's warm-up
            live_ms.append(spent * 1000)
            full_ms.append(measure.full_compare() * 1000)
            core_spent, core_decided = measure.core()
            core_ms.append(core_spent * 1000)
            binds += len(bound)
            differ += msgspec.json.encode(decided) != msgspec.json.encode(core_decided)
        # as many gangs end and jobs arrive as were bound (at least ``churn``): every cycle binds about
        # as many as the core's cycle on its static snapshot
        turnover = max(churn, len(bound))
        _between_cycles(fold, bound, turnover, _new_jobs(waiting, cycle, turnover))
    live_p50, core_p50 = statistics.median(live_ms), statistics.median(core_ms)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "pending": pending,
        "running_jobs": sum(j.state in ("bound", "running") for j in fold.state.jobs.values()),
        "cycles": cycles,
        "min_churn_per_cycle": churn,
        "binds_per_cycle": round(binds / cycles, 1),
        "live_cycle_cpu_ms_p50": round(live_p50, 2),
        "full_compare_cycle_cpu_ms_p50": round(statistics.median(full_ms), 2),
        "core_cycle_cpu_ms_p50": round(core_p50, 2),
        "live_over_core": round(live_p50 / core_p50, 3) if core_p50 > 0 else None,
        # cycles whose live decisions were not byte for byte the core's on a model built from scratch
        "cycles_deciding_otherwise": differ,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.cyclebench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pending", type=int, default=2_500)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument(
        "--churn", type=int, default=100, help="gangs ending and jobs arriving between cycles"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    res = run_cycle_bench(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, pending=args.pending, cycles=args.cycles,
        churn=args.churn,
    )  # fmt: skip
    print(json.dumps(res, sort_keys=True) if args.json else "\n".join(f"{k:32} {v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
