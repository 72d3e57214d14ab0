"""Pure folds over the event log."""

from .cluster import ACTIVE, TERMINAL, ClusterState, JobState, JobView, NodeStatus, NodeView

__all__ = ["ACTIVE", "TERMINAL", "ClusterState", "JobState", "JobView", "NodeStatus", "NodeView"]
