"""When a gang leaves a node that is going out of service. Pure.

A node goes out of service three ways: an operator drains it (``rally nodes drain``), its signals say it is
degraded (cordoned: a straggler, a throttled GPU, a flapping NIC, a corrected-ECC storm), or they say it
failed (uncorrectable ECC, a fatal XID: drained). No new work lands on it either way; what happens to the
gangs already running there depends on their priority class:

- ``now``: evicted at once (the node is replaced under the gang, which resumes from its last checkpoint);
- ``checkpoint``: evicted right after the gang's next committed checkpoint, so it loses no work, or after
  ``checkpoint_wait_s`` if no checkpoint comes (a job that never checkpoints does not pin a bad node);
- ``finish``: left to run to its end; the node empties as its jobs end.

A failed node is evicted at once whatever the class: its GPU no longer computes correctly (or at all), so
waiting only burns the gang's time.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from rallypoint.state import JobView, NodeView

__all__ = ["DEFAULT_DRAIN_POLICY", "DrainAction", "DrainPolicy", "eviction_at", "parse_drain_policy"]

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


def _out_of_service(node: NodeView) -> bool:
    return node.status == "drained" or node.cordoned


def eviction_at(job: JobView, node: NodeView, policy: DrainPolicy) -> float | None:
    """When ``job``'s gang must leave ``node`` (a time at or before now: at once), or None: not for now.

    None while the node is in service, under ``finish``, and under ``checkpoint`` while the deadline is
    ahead and no checkpoint was committed since the node went out (a later commit makes it due at once).
    """
    if not _out_of_service(node):
        return None
    since = node.out_since if node.out_since is not None else 0.0
    if node.health == "failed":
        return since
    action = policy.action_for(job.spec.priority)
    if action == "now":
        return since
    if action == "finish":
        return None
    if job.last_checkpoint_at is not None and job.last_checkpoint_at >= since:
        return job.last_checkpoint_at
    return since + policy.checkpoint_wait_s


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
