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
from .stale import stale_attempts

__all__ = [
    "Action",
    "Append",
    "Kill",
    "Launch",
    "RecoveryConfig",
    "msg_id_for",
    "owned_by",
    "reconcile",
    "stale_attempts",
    "subject_for",
    "wake_at",
    "with_lost_work",
]
