"""Controllers that act on decisions: pure reconcile logic, driven by service shells."""

from .reconcile import (
    Action,
    Append,
    Kill,
    Launch,
    RecoveryConfig,
    msg_id_for,
    owned_by,
    reconcile,
    subject_for,
    wake_at,
    with_lost_work,
)
from .recovery import LaunchRefusal, refusal_event
from .stale import stale_attempts

__all__ = [
    "Action",
    "Append",
    "Kill",
    "Launch",
    "LaunchRefusal",
    "RecoveryConfig",
    "msg_id_for",
    "owned_by",
    "reconcile",
    "refusal_event",
    "stale_attempts",
    "subject_for",
    "wake_at",
    "with_lost_work",
]
