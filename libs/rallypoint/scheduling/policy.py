"""A configured scheduling policy, as the scheduler service and the audit tool use it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import msgspec

import rallypoint
from rallypoint.core import policy_by_name, schedule
from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES, Decisions, PriorityClass, Queue
from rallypoint.state import ClusterState

from .bridge import build_snapshot
from .model_sync import Changed, ModelSync


class SchedulingPolicy:
    """The core's policy ``name`` plus the queue configuration; ``version`` names both exactly (and the
    policy's configuration, defaults included).

    The version goes into every decision event, so an audit knows which code and which configuration
    produced a bind, and can refuse to compare decisions made under a different one.
    """

    def __init__(
        self,
        name: str = "rallypoint",
        *,
        queues: Sequence[Queue] = (),
        priority_classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
    ) -> None:
        self.name = name
        self.policy = policy_by_name(name)
        self.queues = tuple(queues)
        self.priority_classes = tuple(priority_classes)
        # the policy's knobs too: a changed default (e.g. a new preemption rule) changes the decisions, so
        # an audit must not compare them with decisions logged under the old ones
        config = msgspec.json.encode([self.queues, self.priority_classes, self.policy.config])
        digest = hashlib.sha256(config).hexdigest()[:12]
        self.version = f"{name}@{rallypoint.__version__}+{digest}"
        self.model_sync = ModelSync()

    def decide(self, state: ClusterState, now: float) -> Decisions:
        """Decide on a model built from scratch: for a fold at any sequence (the audit), no memory kept."""
        snapshot = build_snapshot(state, now, queues=self.queues, priority_classes=self.priority_classes)
        return schedule(snapshot, self.policy)

    def decide_live(self, state: ClusterState, now: float, *, changed: Changed | None = None) -> Decisions:
        """The same decisions as ``decide``, on a model kept in step with ``state`` across calls: for the
        services, which decide on one growing fold every cycle and cannot afford a rebuild each time.
        ``changed``: the ids the fold touched since the last sync (``ModelSync.sync``), when known."""
        snapshot = self.model_sync.snapshot(
            state, now, queues=self.queues, priority_classes=self.priority_classes, changed=changed
        )
        return schedule(snapshot, self.policy)
