"""Rallypoint's pure scheduling core: ``schedule(snapshot, policy) -> Decisions``.

No I/O, no clock, no randomness, no dependence on dict/set iteration order: the same snapshot and policy
give byte-identical decisions (``msgspec.json.encode(decisions)``).

Intended calling pattern (scheduler service, simulator, audit tool)::

    from rallypoint.core import ClusterModel, Node, RunningJob, PendingJob, Snapshot, schedule, policy_by_name

    cluster = ClusterModel(nodes)                  # or load_cluster("topology.yaml"); keep it for the run
    policy = policy_by_name("rallypoint")          # or "fifo", "easy-backfill", "las"; overrides={...}
    pending: dict[str, PendingJob] = {}
    on every event instant (submit / end / node failure):
        apply the event incrementally:   cluster.bind(job) / cluster.unbind(job_id) /
                                         cluster.set_schedulable(node_id, False) / pending[...] = ...
        d = schedule(Snapshot(now=t, cluster=cluster, pending=tuple(pending.values()), queues=queues),
                     policy)
        for b in d.binds: cluster.bind(RunningJob(id=b.job_id, placements=b.placements, ...));
                          del pending[b.job_id]
        for p in d.preemptions: ask p.victim_id to stop; while it stops, cluster.update_running(
                          victim with preempting_for=p.for_job) so later cycles keep its GPUs for
                          the preemptor; once stopped, cluster.unbind it and re-queue it as a
                          PendingJob with attained_gpu_s and last_preempted_at set
        for r in d.resizes: unbind + bind the job with its new placements
        d.pending has one PendingReason per job still waiting (code, message, position)

``schedule`` never mutates ``cluster``; each call costs a copy of a few flat per-node arrays plus work
proportional to what can be placed. Decisions are computed for the snapshot as a whole: apply all binds
of one call before calling again.
"""

from __future__ import annotations

from rallypoint.core.cluster import ClusterModel, load_cluster, nodes_from_spec
from rallypoint.core.config import PolicyConfig
from rallypoint.core.engine import run_cycle
from rallypoint.core.policies import Policy, policy_by_name, policy_from_config, policy_names, register_policy
from rallypoint.core.types import (
    DEFAULT_PRIORITY_CLASSES,
    Bind,
    Decisions,
    Node,
    PendingJob,
    PendingReason,
    Preemption,
    PriorityClass,
    Queue,
    Quota,
    Reservation,
    Resize,
    RunningJob,
    Snapshot,
    TaskPlacement,
)

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Bind",
    "ClusterModel",
    "Decisions",
    "Node",
    "PendingJob",
    "PendingReason",
    "Policy",
    "PolicyConfig",
    "Preemption",
    "PriorityClass",
    "Queue",
    "Quota",
    "Reservation",
    "Resize",
    "RunningJob",
    "Snapshot",
    "TaskPlacement",
    "load_cluster",
    "nodes_from_spec",
    "policy_by_name",
    "policy_from_config",
    "policy_names",
    "register_policy",
    "schedule",
]


def schedule(snapshot: Snapshot, policy: Policy) -> Decisions:
    """One scheduling cycle: binds, reservations, preemptions, resizes and a reason per waiting job."""
    return run_cycle(snapshot, policy)
