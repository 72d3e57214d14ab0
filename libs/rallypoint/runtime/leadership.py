"""Leading a single-writer tree: campaign for the lease, fence, cycle, step down, campaign again.

Shared by every leader-elected service (the scheduler). A service supplies a ``FencedLoop``:
its ``writer`` fences the tree and ``cycle()`` makes one round of decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from rallypoint.eventlog import AppendConflict, LogUnavailable
from rallypoint.eventlog.pacing import ReadPacing

from .fencing import FencedWriter
from .follower import Follower
from .leader import LeaderLease

_log = logging.getLogger("rallypoint.leadership")


class FencedLoop(Protocol):
    writer: FencedWriter
    follower: Follower
    tick_s: float

    async def cycle(self) -> int: ...

    def idle(self) -> None:
        """A whole tick passed without a change: housekeeping that must stay off a burst's path."""
        ...


async def lead(loop: FencedLoop, lease: LeaderLease, stop: asyncio.Event, *, term: int) -> None:
    """Fence older leaders, then cycle on every change (event-driven requeue) and on a slow tick."""
    await loop.writer.start_epoch(term)
    while not stop.is_set() and lease.is_leader:
        loop.follower.changed.clear()
        await loop.cycle()
        try:
            await asyncio.wait_for(loop.follower.changed.wait(), loop.tick_s)
        except TimeoutError:
            loop.idle()


async def lead_while_elected(
    loop: FencedLoop, lease: LeaderLease, stop: asyncio.Event, *, pacing: ReadPacing | None = None
) -> None:
    """Campaign, lead, step down on a conflict or a lost lease, campaign again; until stop.

    Stepping down on ``AppendConflict`` is the point of fencing: a newer leader exists, so this one
    stops writing at once rather than trusting its lease. ``pacing``: the connection's read pacing, a
    standby's only (a leader reads each event as it comes)."""
    role = loop.writer.role
    while not stop.is_set():
        term = await lease.campaign(stop)
        if term is None or stop.is_set():
            break
        try:
            with pacing.suspended() if pacing is not None else contextlib.nullcontext():
                await lead(loop, lease, stop, term=term)
        except AppendConflict as conflict:
            _log.warning("%s: fenced by a newer leader (%s); stepping down", role, conflict)
        except (LogUnavailable, TimeoutError) as exc:
            _log.warning("%s: lost the log while leading (%s); stepping down", role, exc)
        finally:
            with contextlib.suppress(Exception):
                await lease.resign()
