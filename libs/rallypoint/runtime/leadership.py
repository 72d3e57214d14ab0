"""Leading a single-writer tree: campaign for the lease, fence, cycle, step down, campaign again.

Shared by every leader-elected service (the scheduler). A service supplies a ``FencedLoop``:
its ``writer`` fences the tree and ``cycle()`` makes one round of decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
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
    #: the least time from one cycle's start to the next's while changes keep coming (0: none)
    min_cycle_gap_s: float

    async def cycle(self) -> int: ...

    def idle(self) -> None:
        """A whole tick passed without a change: housekeeping that must stay off a burst's path."""
        ...


async def lead(loop: FencedLoop, lease: LeaderLease, stop: asyncio.Event, *, term: int) -> None:
    """Fence older leaders, then cycle on every change (event-driven requeue) and on a slow tick.

    A change that comes within ``min_cycle_gap_s`` of the last cycle's start waits out the rest of it,
    so that what else arrives meanwhile is decided in the same cycle: under a stream of submissions a
    cycle's fixed cost (syncing the model, its write, every service folding it) is paid for more jobs. A
    change after a quiet moment is decided at once."""
    await loop.writer.start_epoch(term)
    while not stop.is_set() and lease.is_leader:
        loop.follower.changed.clear()
        began = time.monotonic()
        await loop.cycle()
        try:
            await asyncio.wait_for(loop.follower.changed.wait(), loop.tick_s)
        except TimeoutError:
            loop.idle()
            continue
        rest = began + loop.min_cycle_gap_s - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)


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
