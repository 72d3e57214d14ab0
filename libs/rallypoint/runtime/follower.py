"""A ClusterState kept at the log's tip: the live view every stateful service shell holds."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import logging
import time

import msgspec

from rallypoint.eventlog import EventLog, Recorded, SnapshotStore, StateSnapshot, stored
from rallypoint.eventlog.snapshots import last_record, refusal
from rallypoint.events import Event, SnapshotTaken
from rallypoint.events.codec import Quarantined
from rallypoint.events.subjects import STREAM_SUBJECTS
from rallypoint.observability.jobtraces import JobTraces
from rallypoint.state import FOLD_VERSION, ClusterState

from .changes import Changes, ChangeSet

__all__ = ["ChangeSet", "Changes", "Follower"]

_log = logging.getLogger("rallypoint.follower")

#: nodes or jobs hashed between two yields to the event loop while a snapshot is saved (~5-10 ms of CPU)
_HASH_PIECES = 256


class Follower:
    """Keeps a ClusterState folded up to the log's tip; keeps a change feed per consumer (``changes``);
    wakes a waiter only when what it waits for has happened.

    A message this version cannot read is quarantined (kept in the state, logged), never a reason to
    stop: a service that stopped folding would stall without a word while its peers went on.

    ``subjects`` narrows the fold to part of the log (the health monitor folds ``rally.node.>``): the
    state then holds only what those events say, its ``last_seq`` is the last of them applied, and the
    stream position it is compared with is the last stored on those subjects.
    """

    def __init__(self, log: EventLog, *, subjects: str = STREAM_SUBJECTS) -> None:
        self.log = log
        self.subjects = subjects
        self.state = ClusterState()
        self._signals: list[asyncio.Event] = []
        # Set on every event the follow applies: for a fold's one consumer (the scheduler's loop). A fold
        # several consumers share (``runtime.cohost``) gives each its own ``change_signal``, since one
        # consumer's ``clear`` would swallow a wake-up the other had not yet seen.
        self.changed = self.change_signal()
        # ``wait_for`` waiters by the sequence they wait for (smallest first): an applied event resolves
        # only those it satisfied, instead of waking every waiter to re-check (notify_all) on every event.
        self._seq_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._abandoned = 0  # entries of timed-out waiters still in the heap
        self._tiebreak = itertools.count()
        self._change_waiters: list[asyncio.Future[None]] = []  # ``next_change``: any applied event
        self._change_sets: list[ChangeSet] = []
        self.stream_seq: int | None = None  # the stream's last sequence when last probed (health reports)
        self.traces = JobTraces()  # each job's trace, for the spans of the services acting on it
        # set while ``save`` hashes the fold in pieces: the follow applies nothing until it is thawed
        self._thawed: asyncio.Event | None = None
        self.save_cpu_s = 0.0  # CPU the last ``save`` took to encode and hash the fold (this thread's)

    def changes(self) -> ChangeSet:
        """A change feed of its own for one consumer: the jobs and nodes each event applied from now on
        touched, accumulated until the consumer takes them. Its first take says ``everything``."""
        change_set = ChangeSet()
        self._change_sets.append(change_set)
        return change_set

    def change_signal(self) -> asyncio.Event:
        """An event of one consumer's own, set whenever the follow applies an event (the consumer clears
        it before looking at what changed, then waits for it)."""
        signal = asyncio.Event()
        self._signals.append(signal)
        return signal

    def _fold(self, rec: Recorded | Quarantined) -> None:
        self.traces.note(rec)
        self.apply(rec.seq, stored(rec))

    def apply(self, seq: int, item: Event | Quarantined) -> None:
        """Fold what the log stores at ``seq`` into the state and the change feeds, and wake who waited
        for it (the follow and the replay call it; a test may call it to drive a consumer)."""
        touched = self.state.apply_stored(seq, item)
        for change_set in self._change_sets:
            change_set.add(touched)
        self._wake()

    async def catch_up(self) -> None:
        """Fold up to the log's last sequence (as of the call); wakes ``wait_for`` waiters as it goes, so a
        wait for a sequence this replay applies ends when it is applied, not at its timeout."""
        replay = self.log.replay(from_seq=self.state.last_seq + 1, subjects=self.subjects, quarantine=True)
        async for rec in replay:
            if self._thawed is not None:
                await self._thawed.wait()  # as in ``run``: a snapshot is being hashed
            self._fold(rec)

    async def run(self) -> None:
        follow = self.log.follow(from_seq=self.state.last_seq + 1, subjects=self.subjects, quarantine=True)
        async for rec in follow:
            if self._thawed is not None:
                await self._thawed.wait()  # a snapshot is being hashed: the fold must hold still
            self._fold(rec)
            for signal in self._signals:
                signal.set()

    def _wake(self) -> None:
        """Resolve the waiters whose condition now holds: every ``next_change``, and the ``wait_for``s of
        sequences up to the fold's."""
        if self._change_waiters:
            waiters, self._change_waiters = self._change_waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._wake_seq_waiters()

    def _wake_seq_waiters(self) -> None:
        heap, last = self._seq_waiters, self.state.last_seq
        while heap and heap[0][0] <= last:
            future = heapq.heappop(heap)[2]
            if future.done():
                self._abandoned -= 1
            else:
                future.set_result(None)

    @property
    def partial(self) -> bool:
        """True when this fold reads part of the log only (``subjects``)."""
        return self.subjects != STREAM_SUBJECTS

    async def probe_stream(self) -> None:
        """Record the last sequence stored on this fold's subjects, to report how far the fold lags it."""
        self.stream_seq = await self.log.last_seq(self.subjects)  # the whole stream's: stream info

    def position(self) -> tuple[int, int | None]:
        """(the sequence this fold has applied, the stream's last sequence when last probed)"""
        return self.state.last_seq, self.stream_seq

    def degraded(self) -> list[str]:
        """Why this service cannot fully follow the log: newer versions of events it must understand."""
        return self.state.quarantine.newer_versions()

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Until the fold has applied ``seq`` (our own append, say); TimeoutError after ``timeout``."""
        if self.state.last_seq >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._seq_waiters, (seq, next(self._tiebreak), future))
        try:
            await asyncio.wait_for(future, timeout)
        finally:
            if not future.done() or future.cancelled():
                self._abandon()

    def _abandon(self) -> None:
        """A waiter gave up: its entry stays in the heap until its sequence comes or, when such entries
        are most of the heap (waits for sequences far ahead that never came), a prune drops them all."""
        self._abandoned += 1
        if self._abandoned > 64 and self._abandoned * 2 > len(self._seq_waiters):
            self._seq_waiters = [entry for entry in self._seq_waiters if not entry[2].done()]
            heapq.heapify(self._seq_waiters)
            self._abandoned = 0

    async def restore(self, store: SnapshotStore) -> bool:
        """Start from the role's snapshot, if the log vouches for it; the tail of the log is replayed after
        it. A snapshot the log does not vouch for (no record of it, another position, hash or fold
        version: planted, or left by a save that failed half-way) is ignored with a warning."""
        record = await last_record(self.log, store.role)
        found = await store.load(record.seq if record is not None else None)
        if found is None:
            return False
        state = _verified(found, record)
        if isinstance(state, str):
            _log.warning(
                "ignoring the %s snapshot at seq %d: %s; folding from the log",
                store.role,
                found.seq,
                state,
                extra={"seq": found.seq},
            )
            return False
        self.state = state
        for change_set in self._change_sets:
            change_set.invalidate()  # what they hold describes the state just replaced
        self._wake_seq_waiters()
        return True

    async def save(self, store: SnapshotStore) -> int:
        """Save the fold as the role's snapshot and record its hash in the log; returns its position.

        The encoding and the hash must describe one position, so the follow applies nothing meanwhile;
        but the hash of a large fold takes a second or more of CPU (12,500 nodes and 12,000 jobs: 0.5 s on a
        quiet core), during which a service that hashed in one step ran nothing else, and its partition
        leases (renewed every 0.4 s) expired. It is hashed in pieces instead, giving the loop back every
        ``_HASH_PIECES`` pieces; only the fold waits, and catches up after."""
        thawed = self._thawed = asyncio.Event()
        try:
            # Only this save's own steps are timed, not the other tasks that run while it yields.
            began = time.thread_time()
            seq, payload = self.state.last_seq, self.state.encode()
            digest = hashlib.sha256()
            for i, piece in enumerate(self.state.canonical_pieces()):
                digest.update(piece)
                if i % _HASH_PIECES == _HASH_PIECES - 1:
                    spent = time.thread_time() - began
                    await asyncio.sleep(0)
                    began = time.thread_time() - spent
            self.save_cpu_s = time.thread_time() - began
        finally:
            self._thawed = None
            thawed.set()
        await store.save(self.log, StateSnapshot(seq, digest.hexdigest(), payload), FOLD_VERSION)
        return seq

    async def next_change(self, timeout: float) -> bool:
        """Wait for the next applied event (True) or the timeout (False). Safe for many waiters."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if len(self._change_waiters) > 64:  # timed-out waits pile up while no event comes
            self._change_waiters = [waiter for waiter in self._change_waiters if not waiter.done()]
        self._change_waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return False
        return True


def _verified(found: StateSnapshot, record: SnapshotTaken | None) -> ClusterState | str:
    """The state in ``found`` when its role's last SnapshotTaken (``record``) vouches for it; else why not."""
    if record is None:
        return "the log holds no SnapshotTaken for it"
    why = refusal(record, found.seq, FOLD_VERSION)
    if why is not None:
        return why
    try:
        state = ClusterState.decode(found.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"undecodable ({exc})"
    if state.last_seq != found.seq:
        return f"the state inside is at seq {state.last_seq}, the object says seq {found.seq}"
    digest = state.hash()
    if digest != record.state_hash:
        return f"its state hashes to {digest}, the SnapshotTaken at seq {record.seq} says {record.state_hash}"
    return state
