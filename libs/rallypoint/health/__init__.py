"""Node health: turning heartbeats and GPU samples into node events. Pure."""

from .liveness import FATAL_XIDS, Decision, HealthPolicy, assess

__all__ = ["FATAL_XIDS", "Decision", "HealthPolicy", "assess"]
