"""The common body of a stateful service: a Follower at the log's tip, started from a snapshot.

Every service that folds the whole log keeps its own snapshot of it (``rallypoint.eventlog.snapshots``:
its role's bucket, which no other identity may write, and a ``SnapshotTaken`` in the log vouching for
each save), so its next start is "snapshot + the tail of the log" and no other service can choose the
state it starts from. A service that folds part of the log (``subjects``: the health monitor reads the
nodes' subjects only) replays its part at start and keeps no snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterator

from rallypoint.eventlog import EventLogError, SnapshotStore
from rallypoint.events.subjects import STREAM_SUBJECTS

from .follower import Follower
from .health import add_health_check
from .heap import settle_heap
from .reports import set_fold_position
from .service import ServiceContext

_log = logging.getLogger("rallypoint.following")


def snapshot_every_events() -> int:
    """Save after this many new events (``RALLY_SNAPSHOT_EVERY``: small clusters and tests). Read when
    the loop starts, never at import: the local cluster's fork server imports this module before it
    knows a service's environment (``rallypoint.infra.forkserver``)."""
    return int(os.environ.get("RALLY_SNAPSHOT_EVERY", "10000"))


def snapshot_check_s() -> float:
    """How often the count of new events is checked (``RALLY_SNAPSHOT_CHECK_S``)."""
    return float(os.environ.get("RALLY_SNAPSHOT_CHECK_S", "30"))


#: How often the stream's last sequence is read for the fold's lag in /healthz.
PROBE_S = 2.0


#: A fold opened and its follow task (whose end the health checks report).
_Opened = tuple[Follower, "asyncio.Task[None]"]


class SharedFold:
    """One fold for every service of a process that hosts several (``runtime.cohost``): the follow, its
    NATS consumer and its snapshots are paid once, not once per service.

    The ``owner`` role's service opens it as it would its own (its snapshot restored, its snapshots
    saved: the bucket only that role may write); every other hosted service waits for it, then gets the
    same ``Follower`` with its own health checks and fold report. Each consumer keeps its own change
    feed and wake-up (``Follower.changes``, ``change_signal``), so none takes another's changes."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._opened: asyncio.Future[_Opened] | None = None

    def _future(self) -> asyncio.Future[_Opened]:
        if self._opened is None:
            self._opened = asyncio.get_running_loop().create_future()
        return self._opened

    async def follower_for(self, ctx: ServiceContext, *, snapshots: bool) -> Follower:
        opened = self._future()
        if ctx.role == self.owner and not opened.done():
            try:
                found = await _open(ctx, snapshots=snapshots, subjects=STREAM_SUBJECTS)
            except BaseException as exc:
                opened.set_exception(exc)  # the others waiting would wait for ever
                raise
            opened.set_result(found)
        follower, follow = await asyncio.shield(opened)
        _report(ctx, follower, follow)
        return follower


_shared: SharedFold | None = None


@contextlib.contextmanager
def sharing_one_fold(owner: str) -> Iterator[SharedFold]:
    """While open, ``open_follower`` of the whole log hands every service of this process one fold."""
    global _shared
    previous, _shared = _shared, SharedFold(owner)
    try:
        yield _shared
    finally:
        _shared = previous


async def open_follower(
    ctx: ServiceContext, *, snapshots: bool = True, subjects: str = STREAM_SUBJECTS
) -> Follower:
    """Restore from the newest snapshot (if any), replay the tail, then follow in the background; with
    ``subjects``, replay and follow those subjects only, without snapshots. In a process hosting several
    services (``sharing_one_fold``), the whole log's fold is opened once and shared.

    The follow and snapshot tasks are cancelled when the service's exit stack closes. Health reports the
    service degraded while the log holds newer event versions than it reads, and unhealthy if following
    stops (never silently: the reason is logged)."""
    if _shared is not None and subjects == STREAM_SUBJECTS:
        return await _shared.follower_for(ctx, snapshots=snapshots)
    follower, follow = await _open(ctx, snapshots=snapshots, subjects=subjects)
    _report(ctx, follower, follow)
    return follower


async def _open(ctx: ServiceContext, *, snapshots: bool, subjects: str) -> _Opened:
    """The fold caught up and following, with its probe and snapshot tasks stopped with ``ctx``."""
    log = await ctx.event_log()
    follower = Follower(log, subjects=subjects)
    store: SnapshotStore | None = None
    if snapshots and not follower.partial:
        try:
            store = await ctx.snapshots()
            if await follower.restore(store):
                _log.info("restored state at seq %d from snapshot", follower.state.last_seq)
        except (EventLogError, TimeoutError, OSError) as exc:
            _log.warning("no snapshot (%s); replaying from the start", exc)
    await follower.catch_up()
    settle_heap()  # the caught-up fold, out of the collector's way (a service's own process only)
    only = f" on {subjects} (this fold reads those subjects only)" if follower.partial else ""
    _log.info("caught up%s at seq %d", only, follower.state.last_seq)
    follow = asyncio.create_task(follower.run(), name="follow")
    follow.add_done_callback(lambda task: _follow_ended(task, follower))
    tasks = [follow, asyncio.create_task(_probe_periodically(follower), name="probe")]
    if store is not None:
        tasks.append(asyncio.create_task(save_periodically(follower, store), name="snapshots"))

    async def stop_tasks() -> None:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5.0)

    ctx.stack.push_async_callback(stop_tasks)
    return follower, follow


def _report(ctx: ServiceContext, follower: Follower, follow: asyncio.Task[None]) -> None:
    """The service's health and fold report on ``follower``."""
    add_health_check(ctx, follower.degraded, degraded=True)
    add_health_check(ctx, lambda: ["following the log stopped"] if follow.done() else [], degraded=False)
    set_fold_position(ctx, follower.position, subjects=follower.subjects if follower.partial else None)


def _follow_ended(task: asyncio.Task[None], follower: Follower) -> None:
    if task.cancelled():
        return
    # Every service acts on this fold: one that stops following must say so, or it stalls unseen.
    _log.error(
        "following the log stopped at seq %d: %r",
        follower.state.last_seq,
        task.exception(),
        extra={"seq": follower.state.last_seq},
    )


async def _probe_periodically(follower: Follower) -> None:
    while True:
        # An unreachable log leaves the last known value: the health report says it is not connected.
        with contextlib.suppress(EventLogError, TimeoutError, OSError):
            await follower.probe_stream()
        await asyncio.sleep(PROBE_S)


#: CPU a replay spends per event (``followbench``'s ``replay_cpu_us_per_event``, 16 us on this project's
#: reference machine): what a snapshot spares a restart for each event of the tail it would replay.
REPLAY_S_PER_EVENT = 16e-6
#: A save is due once the tail a restart would replay costs this many times the last save's own CPU.
TAIL_OVER_SAVE = 2.0


def events_before_next_save(every: int, save_cpu_s: float) -> int:
    """New events before the next save: ``every`` at least, and more where a save costs more than
    replaying them would. A save encodes and hashes the whole fold, in every service that keeps a
    snapshot: 0.22-0.24 s of CPU each at 12,500 nodes and ~10,000 jobs (``rally bench cluster``'s logs);
    every 10,000 events (~2,000 jobs) that was ~0.1 ms of CPU per job in each of them, as much as folding
    the jobs' events. Spaced so that the replay a restart adds costs at most ``TAIL_OVER_SAVE`` saves (a
    save costs at most half the replay it spares): there, every ~27,000-30,000 events, and at most ~0.5 s
    more replay at a restart."""
    return max(every, int(TAIL_OVER_SAVE * save_cpu_s / REPLAY_S_PER_EVENT))


async def save_periodically(follower: Follower, store: SnapshotStore) -> None:
    """Save ``follower``'s fold every ``snapshot_every_events()`` new events or more
    (``events_before_next_save``), checked every ``snapshot_check_s()``; a failed save is logged and tried
    again at the next check."""
    saved = follower.state.last_seq
    every, check_s = snapshot_every_events(), snapshot_check_s()
    due = every
    # The services of a cluster start together: their first checks are spread over a whole period, so
    # their saves (a second of CPU each at 12,500 nodes) do not all fall on the same moment.
    await asyncio.sleep(random.uniform(0.0, check_s))
    while True:
        await asyncio.sleep(check_s)
        if follower.state.last_seq - saved < due:
            continue
        try:
            saved = await follower.save(store)
            due = events_before_next_save(every, follower.save_cpu_s)
            _log.info(
                "saved snapshot at seq %d (%.3f s of CPU; the next after %d new events)",
                saved,
                follower.save_cpu_s,
                due,
            )
        except (EventLogError, TimeoutError, OSError) as exc:
            _log.warning("snapshot not saved: %s", exc)


async def with_follower(
    ctx: ServiceContext, work: Callable[[Follower], Awaitable[None]], *, subjects: str = STREAM_SUBJECTS
) -> int:
    """Run ``work`` with a live Follower (see ``open_follower``)."""
    await work(await open_follower(ctx, subjects=subjects))
    return 0
