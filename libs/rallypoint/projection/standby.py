"""N projectors on one database: the holder of the leader lease projects, the others stand by warm.

The lease (``runtime.leader.LeaderLease``, key ``projector`` in KV ``rally-leader``) only decides who
*tries* to write; it is "probably the leader", never a guarantee. The fence stays the position row:
every batch moves it only from the position it was folded from (``Store.write``), so a deposed
projector that still believes it leads (paused, partitioned, its lease just expired) has its next
transaction refused (``PositionMoved``) and commits nothing.

A standby keeps its in-memory fold at the stored position (``Projector.follow_stored``: read the
position, fold the log up to it, write nothing), so on taking over it folds only the events since its
last step and then follows the log from there. A takeover after the holder's ``kill -9`` takes one lease
TTL (the key expires), a campaign poll and that small catch-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rallypoint.eventlog import LogUnavailable
from rallypoint.runtime.leader import LeaderLease

from .projector import Projector
from .store import TRANSIENT_ERRORS

log = logging.getLogger("rallypoint.projection.standby")

# What only delays a standby's fold: PostgreSQL or the log away for a moment.
_OUTAGES: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, LogUnavailable)


async def project_while_elected(
    projector: Projector, lease: LeaderLease, stop: asyncio.Event, *, poll: float | None = None
) -> None:
    """Stand by (warm) until the lease is ours, project while it stays ours, stand by again; until
    ``stop``. ``poll``: seconds between a standby's steps (default a quarter of the lease TTL)."""
    interval = poll if poll is not None else lease.ttl / 4
    while not stop.is_set():
        if not await _stand_by(projector, lease, stop, interval):
            return
        await _project(projector, lease, stop)


async def _stand_by(projector: Projector, lease: LeaderLease, stop: asyncio.Event, interval: float) -> bool:
    """Keep the fold warm until we win the lease (True) or are asked to stop (False)."""
    log.info("projection %r: standing by (another projector holds the lease)", projector.name)
    while not stop.is_set():
        if await lease.try_acquire():
            await _warm(projector)  # the last committed batches of the one we replace
            log.info("projection %r: took the lease (epoch %s); projecting", projector.name, lease.epoch)
            return True
        await _warm(projector)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
    return False


async def _warm(projector: Projector) -> None:
    """One standby step; an outage only delays the fold (the next step or the takeover catches up)."""
    try:
        await projector.follow_stored()
    except _OUTAGES as exc:
        log.debug("projection %r: standby step failed (%s: %s)", projector.name, type(exc).__name__, exc)


async def _project(projector: Projector, lease: LeaderLease, stop: asyncio.Event) -> None:
    """Project until ``stop`` or until the lease is lost; the batch in flight then commits or is fenced."""
    term_over = asyncio.Event()

    async def watch() -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lease.lost.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        term_over.set()

    watcher = asyncio.create_task(watch(), name=f"projector-term-{lease.holder}")
    try:
        await projector.run(term_over)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if not stop.is_set():
        log.warning("projection %r: lost the lease; standing by", projector.name)
