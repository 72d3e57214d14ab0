"""Ranks a node still runs for attempts the log has moved on from. Pure.

A node that was lost and answers again may still run ranks of a gang that was repaired elsewhere (or
ended) meanwhile. They are killed, never re-adopted: the new attempt has its own rendezvous and its own
GPUs, and a stale rank would only write over its checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable

from rallypoint.protocol import RankStatus
from rallypoint.state import LAUNCHED, ClusterState


def stale_attempts(state: ClusterState, node_id: str, ranks: Iterable[RankStatus]) -> list[tuple[str, int]]:
    """(job, attempt) pairs with a live rank on ``node_id`` that the log does not place there now."""
    stale: set[tuple[str, int]] = set()
    for rank in ranks:
        if rank.exit_code is not None:
            continue
        job = state.jobs.get(rank.job_id)
        current = (
            job is not None
            and job.state in LAUNCHED
            and job.attempt == rank.attempt
            and any(p.node_id == node_id for p in job.placements)
        )
        if not current:
            stale.add((rank.job_id, rank.attempt))
    return sorted(stale)
