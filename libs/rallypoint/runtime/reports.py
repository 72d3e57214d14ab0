"""What a service says about itself, read by both its ``/healthz`` (``health``) and its ``/metrics``
(``metrics``): where its fold stands in the log, and, for a leader-elected role, whether it leads now.

Kept apart from both so that neither reads the other: the health server mounts the metrics route, and the
metrics read these reports.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .service import ServiceContext

#: Where a service's fold stands: (the sequence it has applied, the stream's last sequence or None).
FoldPosition = Callable[[], tuple[int, int | None]]


class Leadership(NamedTuple):
    """A leader-elected role of a service and whether this instance leads it now."""

    role: str
    leads: bool


# Weak: a context lives as long as its service and nothing here may keep it alive.
_positions: weakref.WeakKeyDictionary[ServiceContext, tuple[FoldPosition, str | None]] = (
    weakref.WeakKeyDictionary()
)
_leaders: weakref.WeakKeyDictionary[ServiceContext, tuple[str, Callable[[], bool]]] = (
    weakref.WeakKeyDictionary()
)


def set_fold_position(ctx: ServiceContext, position: FoldPosition, *, subjects: str | None = None) -> None:
    """Have ``/healthz`` report how far the service's fold lags the log, or with ``subjects`` (a fold of
    part of the log) the last sequence stored on them, and name them (``fold_subjects``)."""
    _positions[ctx] = (position, subjects)


def log_report(ctx: ServiceContext) -> dict[str, Any]:
    """Whether the service reaches the log, and how far behind its fold is (when it folds one)."""
    nc = ctx.nats_client
    report: dict[str, Any] = {"connected": nc is not None and nc.is_connected}
    found = _positions.get(ctx)
    if found is not None:
        position, subjects = found
        fold_seq, stream_seq = position()
        lag = None if stream_seq is None else max(0, stream_seq - fold_seq)
        report.update(fold_seq=fold_seq, stream_seq=stream_seq, lag=lag)
        if subjects is not None:
            report["fold_subjects"] = subjects
    pacing = ctx.read_pacing
    if pacing is not None:  # how the connection paces its reads (docs/deployment.md, "Read pacing")
        report.update(read_pacing_s=pacing.seconds, read_pauses=pacing.pauses)
    return report


def set_leadership(ctx: ServiceContext, role: str, leads: Callable[[], bool]) -> None:
    """Declare the service leader-elected for ``role``; ``leads()`` says whether this instance leads now."""
    _leaders[ctx] = (role, leads)


def leadership(ctx: ServiceContext) -> Leadership | None:
    """The service's role and whether it leads now; None for a service that is not leader-elected."""
    found = _leaders.get(ctx)
    if found is None:
        return None
    role, leads = found
    return Leadership(role, leads())
