"""Pure folds over the event log."""

from .cluster import (
    ACTIVE,
    LAUNCHED,
    TERMINAL,
    CheckpointView,
    ClusterState,
    JobState,
    JobView,
    NodeStatus,
    NodeView,
)

__all__ = [
    "ACTIVE",
    "LAUNCHED",
    "TERMINAL",
    "CheckpointView",
    "ClusterState",
    "JobState",
    "JobView",
    "NodeStatus",
    "NodeView",
]
