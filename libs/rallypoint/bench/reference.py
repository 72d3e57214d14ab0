"""A yardstick for the machine's speed at the moment: the CPU this process spends folding a fixed log.

On a shared VM every process runs 30-60 % slower in some hours than in others, so a CPU figure from one
run of ``rally bench cluster`` cannot be compared with another hour's. The bench folds the same
synthetic jobs (submitted, bound in cycles of ``BINDS_PER_CYCLE``, started: what the submissions' window
makes every service fold) just before its window and just after, with the code every service folds with
(``decode_stored``, ``ClusterState.apply_stored``). A figure over this one moves with the code, not the
hour; the figure itself is what a target is judged on.
"""

from __future__ import annotations

import time

from rallypoint.events import (
    Event,
    GangBound,
    GangsBound,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    subjects,
)
from rallypoint.events.catalogue import TaskPlacement
from rallypoint.events.codec import decode_stored, encode
from rallypoint.events.synthetic import GPUS_PER_NODE, node_name, registered_node
from rallypoint.state import ClusterState

#: jobs folded per round; nodes enough for each to hold one GPU
JOBS = 1_700
BINDS_PER_CYCLE = 17
ROUNDS = 5

_Message = tuple[bytes, str]


def _encoded(events: list[Event]) -> list[_Message]:
    return [(encode(e), subjects.for_event(e)) for e in events]


def _cluster(nodes: int) -> list[_Message]:
    events: list[Event] = [registered_node(i, at=0.0) for i in range(nodes)]
    events.append(LeaderEpochStarted(epoch=1, leader_id="reference", at=0.0))
    return _encoded(events)


def _jobs(jobs: int) -> list[_Message]:
    """Each cycle's jobs submitted, bound in one ``GangsBound`` (one GPU each), then started."""
    spec = JobSpec(
        name="reference", team="bench", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",)
    )
    events: list[Event] = []
    for cycle in range(jobs // BINDS_PER_CYCLE):
        ids = [f"ref-{cycle}-{k}" for k in range(BINDS_PER_CYCLE)]
        at = 10.0 + cycle
        events += [JobSubmitted(job_id=j, spec=spec, submitted_at=at, submitted_by="reference") for j in ids]
        binds: list[GangBound] = []
        for k, job_id in enumerate(ids):
            gpu = cycle * BINDS_PER_CYCLE + k
            placement = TaskPlacement(
                task=0, node_id=node_name(gpu // GPUS_PER_NODE), gpus=(gpu % GPUS_PER_NODE,)
            )
            binds.append(
                GangBound(
                    job_id=job_id, attempt=1, epoch=1, placements=(placement,), computed_at_seq=1,
                    policy_version="reference", now=at, at=at,
                )
            )  # fmt: skip
        events.append(GangsBound(binds=tuple(binds)))
        events += [JobStarted(job_id=j, attempt=1, at=at + 0.5) for j in ids]
    return _encoded(events)


def _fold(state: ClusterState, messages: list[_Message], seq: int) -> int:
    for data, subject in messages:
        seq += 1
        state.apply_stored(seq, decode_stored(data, seq=seq, subject=subject))
    return seq


def fold_us_per_job(jobs: int = JOBS) -> float:
    """CPU microseconds this process spends decoding and folding one job's events (the least of
    ``ROUNDS`` rounds, each on a fresh fold of the same cluster)."""
    cycles = jobs // BINDS_PER_CYCLE
    cluster = _cluster(-(-cycles * BINDS_PER_CYCLE // GPUS_PER_NODE))
    work = _jobs(jobs)
    best = float("inf")
    for _ in range(ROUNDS):
        state = ClusterState()
        seq = _fold(state, cluster, 0)
        started = time.process_time()
        _fold(state, work, seq)
        best = min(best, time.process_time() - started)
    return best * 1e6 / (cycles * BINDS_PER_CYCLE)
