"""A ClusterState kept at the log's tip: the live view every stateful service shell holds."""

from __future__ import annotations

import asyncio

import msgspec

from rallypoint.eventlog import EventLog, SnapshotStore, stored
from rallypoint.state import ClusterState


class Follower:
    """Keeps a ClusterState folded up to the log's tip; wakes waiters on every event.

    A message this version cannot read is quarantined (kept in the state, logged), never a reason to
    stop: a service that stopped folding would stall without a word while its peers went on.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.state = ClusterState()
        self.changed = asyncio.Event()
        self._advanced = asyncio.Condition()
        self._waiters = 0  # tasks in wait_for / next_change: the replay wakes them only when there are any
        self.stream_seq: int | None = None  # the stream's last sequence when last probed (health reports)

    async def catch_up(self) -> None:
        """Fold up to the log's last sequence (as of the call); wakes ``wait_for`` waiters as it goes, so a
        wait for a sequence this replay applies ends when it is applied, not at its timeout."""
        async for rec in self.log.replay(from_seq=self.state.last_seq + 1, quarantine=True):
            self.state.apply_stored(rec.seq, stored(rec))
            if self._waiters:
                await self._wake()

    async def run(self) -> None:
        async for rec in self.log.follow(from_seq=self.state.last_seq + 1, quarantine=True):
            self.state.apply_stored(rec.seq, stored(rec))
            self.changed.set()
            await self._wake()

    async def _wake(self) -> None:
        async with self._advanced:
            self._advanced.notify_all()

    async def probe_stream(self) -> None:
        """Record the stream's last sequence, to report how far this fold lags it."""
        self.stream_seq = await self.log.last_seq()

    def position(self) -> tuple[int, int | None]:
        """(the sequence this fold has applied, the stream's last sequence when last probed)"""
        return self.state.last_seq, self.stream_seq

    def degraded(self) -> list[str]:
        """Why this service cannot fully follow the log: newer versions of events it must understand."""
        return self.state.quarantine.newer_versions()

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Until the fold has applied ``seq`` (our own append, say)."""
        self._waiters += 1
        try:
            async with self._advanced:
                await asyncio.wait_for(self._advanced.wait_for(lambda: self.state.last_seq >= seq), timeout)
        finally:
            self._waiters -= 1

    async def restore(self, store: SnapshotStore, name: str) -> bool:
        """Start from the newest snapshot, if any; the tail of the log is replayed after it."""
        found = await store.load(name)
        if found is None:
            return False
        seq, payload = found
        try:
            state = ClusterState.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Written by another version of the fold: replaying from the start is always correct.
            return False
        if state.last_seq != seq:
            return False
        self.state = state
        return True

    async def save(self, store: SnapshotStore, name: str) -> int:
        await store.save(name, self.state.last_seq, self.state.encode())
        return self.state.last_seq

    async def next_change(self, timeout: float) -> bool:
        """Wait for the next applied event (True) or the timeout (False). Safe for many waiters."""
        self._waiters += 1
        try:
            async with self._advanced:
                try:
                    await asyncio.wait_for(self._advanced.wait(), timeout)
                except TimeoutError:
                    return False
        finally:
            self._waiters -= 1
        return True
