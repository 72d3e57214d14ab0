"""When a gang leaves a node that is going out of service. Pure.

A node goes out of service three ways: an operator drains it (``rally nodes drain``), its signals say it is
degraded (cordoned: a straggler, a throttled GPU, a flapping NIC, a corrected-ECC storm), or they say it
failed (uncorrectable ECC, a fatal XID: drained). No new work lands on it either way; what happens to the
gangs already running there depends on their priority class:

- ``now``: evicted at once (the node is replaced under the gang, which resumes from its last checkpoint);
- ``checkpoint``: evicted right after the gang's next committed checkpoint, so it loses no work, or after
  ``checkpoint_wait_s`` if no checkpoint comes (a job that never checkpoints does not pin a bad node);
- ``finish``: left to run to its end; the node empties as its jobs end.

A service (``kind: service``) leaves at once whatever its class: it never ends, so ``finish`` would pin
the node forever, and it keeps no training progress for a checkpoint to save. Its ranks get SIGTERM and
the grace, and it starts again on another node.

A failed node is evicted at once whatever the class: its GPU no longer computes correctly (or at all), so
waiting only burns the gang's time.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from rallypoint.state import ClusterState, JobView, NodeView

__all__ = [
    "DEFAULT_DRAIN_POLICY",
    "DrainAction",
    "DrainPlan",
    "DrainPolicy",
    "JobDrain",
    "drain_plan",
    "eviction_at",
    "job_drain",
    "out_of_service",
    "parse_drain_policy",
]

DrainAction = Literal["now", "checkpoint", "finish"]
DRAIN_ACTIONS: tuple[str, ...] = get_args(DrainAction)


class DrainPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What each priority class's running gangs do when a node under them goes out of service."""

    #: Long jobs checkpoint and lose nothing when evicted right after one; short, cheap work goes at once.
    by_class: dict[str, DrainAction] = msgspec.field(
        default_factory=lambda: {
            "production": "checkpoint",
            "training-high": "checkpoint",
            "training-standard": "checkpoint",
            "development": "now",
            "best-effort": "now",
        }
    )
    #: A class not named above.
    default: DrainAction = "checkpoint"
    #: ``checkpoint`` waits at most this long: 30 min is a typical checkpoint interval for large jobs;
    #: past it the bad node costs more than the work since the last checkpoint.
    checkpoint_wait_s: float = 1800.0

    def action_for(self, priority: str) -> DrainAction:
        return self.by_class.get(priority, self.default)


DEFAULT_DRAIN_POLICY = DrainPolicy()


#: What happens to a gang on a node going out of service, as a user reads it: ``now`` (interrupted at
#: once), ``after-checkpoint`` (at its next committed checkpoint, at the latest by the deadline) or
#: ``at-deadline`` (at the deadline: it has no checkpoint to wait for; or, without a deadline, never:
#: left to run to its end).
DrainPlanKind = Literal["now", "after-checkpoint", "at-deadline"]


class DrainPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What the job controller does with one gang on one out-of-service node, and when."""

    plan: DrainPlanKind
    #: When the gang leaves the node at the latest (at or before now: at once); None: it is not made to.
    deadline: float | None
    #: Why this plan, in words (the class's policy, the checkpoint it waits for or has).
    detail: str


class JobDrain(msgspec.Struct, frozen=True, kw_only=True):
    """The plan of a gang on the out-of-service node it leaves first (a gang may span several)."""

    node_id: str
    #: Why the node is out of service: the operator's reason, or the health monitor's verdict.
    reason: str
    plan: DrainPlan


def out_of_service(node: NodeView) -> bool:
    """Drained or cordoned: no new work, and the gangs on it leave as the drain policy says."""
    return node.status == "drained" or node.cordoned


def drain_plan(job: JobView, node: NodeView, policy: DrainPolicy) -> DrainPlan | None:
    """The plan for ``job``'s gang on ``node``; None while the node is in service.

    The one rule the job controller acts on (``eviction_at`` is its deadline) and the API shows: a
    failed node, or a class whose action is ``now``, is left at once; ``checkpoint`` waits for the
    gang's next commit (one committed since the node went out makes it due at once) at most
    ``checkpoint_wait_s``, and a gang that has committed no checkpoint yet only waits out that time;
    ``finish`` runs to its end.
    """
    if not out_of_service(node) or node.status == "lost":
        return None
    since = node.out_since if node.out_since is not None else 0.0
    priority = job.spec.priority
    if node.health == "failed":
        return DrainPlan(plan="now", deadline=since, detail="the node failed: its GPUs cannot be trusted")
    if job.spec.kind == "service":
        # a service never ends and has no training progress to lose: waiting for it to finish or to
        # checkpoint would pin the node for good. It moves at once, gracefully (SIGTERM, the grace)
        return DrainPlan(plan="now", deadline=since, detail="a service moves at once, to another node")
    action = policy.action_for(priority)
    if action == "now":
        return DrainPlan(plan="now", deadline=since, detail=f"class {priority} drains at once")
    if action == "finish":
        return DrainPlan(plan="at-deadline", deadline=None, detail=f"class {priority} runs to its end")
    if job.last_checkpoint_at is not None and job.last_checkpoint_at >= since:
        return DrainPlan(
            plan="now",
            deadline=job.last_checkpoint_at,
            detail="checkpointed since the drain: nothing to lose",
        )
    deadline = since + policy.checkpoint_wait_s
    if not job.checkpoints:
        return DrainPlan(
            plan="at-deadline",
            deadline=deadline,
            detail="no checkpoint committed yet: runs until the deadline unless it checkpoints or ends first",
        )
    return DrainPlan(
        plan="after-checkpoint",
        deadline=deadline,
        detail="waits for its next checkpoint, at most until the deadline",
    )


def eviction_at(job: JobView, node: NodeView, policy: DrainPolicy) -> float | None:
    """When ``job``'s gang must leave ``node`` (a time at or before now: at once), or None: not for now.

    None while the node is in service, under ``finish``, and under ``checkpoint`` while the deadline is
    ahead and no checkpoint was committed since the node went out (a later commit makes it due at once).
    """
    plan = drain_plan(job, node, policy)
    return None if plan is None else plan.deadline


def _node_reason(node: NodeView) -> str:
    if node.status == "drained":
        return node.status_reason
    return f"cordoned: {node.health}"


def job_drain(job: JobView, state: ClusterState, policy: DrainPolicy) -> JobDrain | None:
    """The plan of ``job`` on the out-of-service node under it that it leaves first (None: none is out
    of service). A node the gang is not made to leave comes after every one it is."""
    if job.terminal:
        return None
    plans = [
        JobDrain(node_id=node_id, reason=_node_reason(node), plan=plan)
        for node_id in sorted({p.node_id for p in job.placements})
        if (node := state.nodes.get(node_id)) is not None
        and (plan := drain_plan(job, node, policy)) is not None
    ]
    return min(plans, key=lambda d: (d.plan.deadline is None, d.plan.deadline or 0.0), default=None)


def parse_drain_policy(text: str, base: DrainPolicy = DEFAULT_DRAIN_POLICY) -> DrainPolicy:
    """``production=finish,development=now`` (``*=...`` sets the default) over ``base``.
    Raises ValueError naming the bad entry."""
    by_class = dict(base.by_class)
    default = base.default
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, action = (part.strip() for part in entry.partition("="))
        if not sep or not name or action not in DRAIN_ACTIONS:
            raise ValueError(f"drain policy entry {entry!r}: expected <class>=<{'|'.join(DRAIN_ACTIONS)}>")
        if name == "*":
            default = action  # type: ignore[assignment]
        else:
            by_class[name] = action  # type: ignore[assignment]
    return msgspec.structs.replace(base, by_class=by_class, default=default)
