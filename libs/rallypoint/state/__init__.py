"""Pure folds over the event log."""

from .cluster import (
    ACTIVE,
    DECISION_ROLES,
    FOLD_VERSION,
    LAUNCHED,
    TERMINAL,
    CheckpointView,
    ClusterState,
    Decision,
    JobState,
    JobView,
    NodeStatus,
    NodeView,
    Refusal,
    ResizeView,
    decision_refusal,
    decision_role,
    launched_on,
)
from .indexes import Touched

__all__ = [
    "ACTIVE",
    "DECISION_ROLES",
    "FOLD_VERSION",
    "LAUNCHED",
    "TERMINAL",
    "CheckpointView",
    "ClusterState",
    "Decision",
    "JobState",
    "JobView",
    "NodeStatus",
    "NodeView",
    "Refusal",
    "ResizeView",
    "Touched",
    "decision_refusal",
    "decision_role",
    "launched_on",
]
