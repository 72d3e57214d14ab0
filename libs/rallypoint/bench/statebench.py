"""Micro-benchmark of the fold's readers at the seed's scale: what a submission's validation and a pending
list cost with the reader index, beside the scans they replaced (same state, same run).

``python -m rallypoint.bench.statebench --nodes 12500 --jobs 19000 --pending 5000`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

from rallypoint.control.reconcile import reconcile
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobQueued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.state.cluster import ClusterState, JobView

GPUS_PER_NODE = 8


def build(nodes: int, jobs: int, pending: int) -> tuple[ClusterState, float]:
    """A state with ``nodes`` 8-GPU nodes and ``jobs`` one-node jobs, all but ``pending`` of them running
    (one per node, round robin); and the fold's rate in events/s while building it."""
    state = ClusterState()
    seq = 1
    state.apply(seq, LeaderEpochStarted(epoch=1, leader_id="bench", at=0.0))
    started = time.perf_counter()
    for i in range(nodes):
        seq += 1
        state.apply(seq, _node(f"n{i:05d}"))
    spec = JobSpec(
        name="b", team="t", gpus=GPUS_PER_NODE, gpus_per_task=GPUS_PER_NODE, ranks_per_task=1, command=("x",)
    )
    for i in range(jobs):
        seq += 1
        job_id = f"j{i:06d}"
        state.apply(seq, JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0))
        if i < jobs - pending and i < nodes:
            seq = _run(state, seq, job_id, f"n{i:05d}")
    return state, (seq - 1) / (time.perf_counter() - started)


def _node(node_id: str) -> NodeRegistered:
    gpus = tuple(GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=1, nvlink_domain=0) for g in range(8))
    return NodeRegistered(
        node_id=node_id,
        address="-",
        rack="r",
        gpu_type="sim",
        gpus=gpus,
        cpu_milli=1,
        memory_mib=1,
        agent_instance="b",
        at=1.0,
    )


def _run(state: ClusterState, seq: int, job_id: str, node_id: str) -> int:
    places = (TaskPlacement(task=0, node_id=node_id, gpus=tuple(range(GPUS_PER_NODE))),)
    bind = GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=places,
        computed_at_seq=0,
        policy_version="b",
        now=1,
        at=1,
    )
    state.apply(seq + 1, bind)
    state.apply(seq + 2, JobStarted(job_id=job_id, attempt=1, resume_step=None, at=2.0))
    return seq + 2


# -- the scans the index replaced (as the readers were written before it) ------------------------------


def scan_validate(state: ClusterState) -> tuple[int, int]:
    largest = max((n.gpu_count for n in state.nodes.values()), default=0)
    return largest, sum(n.gpu_count for n in state.nodes.values())


def scan_pending(state: ClusterState) -> list[JobView]:
    waiting = [j for j in state.jobs.values() if j.state == "pending" and not j.cancel_requested]
    waiting.sort(key=lambda j: j.submitted_seq)
    return waiting


def indexed_validate(state: ClusterState) -> tuple[int, int]:
    return state.largest_node_gpus() or 0, state.total_gpus()


def _reconcile_all(state: ClusterState) -> int:
    now = state.last_seq + 1.0
    return sum(1 for job in state.jobs.values() if not job.terminal and reconcile(job, state, now))


def _touch_then_list(state: ClusterState, job_id: str) -> list[JobView]:
    """An event on one pending job (as each cycle's JobPending is), then the list: the worst case."""
    state.apply(state.last_seq + 1, JobQueued(job_id=job_id, queue="q", at=1.0))
    return state.pending_jobs()


def per_call_us(fn: Callable[[], object], min_s: float = 0.3) -> float:
    """Microseconds per call, the best of three runs of at least ``min_s`` each."""
    best = float("inf")
    for _ in range(3):
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < min_s:
            fn()
            calls += 1
        best = min(best, elapsed / calls)
    return round(best * 1e6, 2)


def run(nodes: int, jobs: int, pending: int) -> dict[str, object]:
    state, fold_rate = build(nodes, jobs, pending)
    pending_id = state.pending_jobs()[0].job_id
    assert indexed_validate(state) == scan_validate(state)
    assert state.pending_jobs() == scan_pending(state)
    return {
        "nodes": nodes,
        "jobs": jobs,
        "pending": len(state.pending_jobs()),
        "fold_events_per_s": round(fold_rate),
        "validate_scan_us": per_call_us(lambda: scan_validate(state)),
        "validate_indexed_us": per_call_us(lambda: indexed_validate(state)),
        "pending_scan_us": per_call_us(lambda: scan_pending(state)),
        "pending_indexed_us": per_call_us(state.pending_jobs),
        "pending_after_an_event_us": per_call_us(lambda: _touch_then_list(state, pending_id)),
        "free_gpus_indexed_us": per_call_us(state.free_gpus),
        # what the job controller paid on every event before it reconciled only what changed (it still
        # runs such a pass at start and every full_sweep_s)
        "reconcile_full_pass_ms": round(per_call_us(lambda: _reconcile_all(state), min_s=0.5) / 1000, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.statebench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--jobs", type=int, default=19_000)
    parser.add_argument("--pending", type=int, default=5_000)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.nodes, args.jobs, args.pending)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
