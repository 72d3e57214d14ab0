"""The projector loop: read the log, fold it in batches, write each batch in one fenced transaction.

How a restart stays exactly-once in effect (the log delivers at least once):

1. ``sync()`` reads the stored position P (and the snapshot, if any, taken at or before P), and folds
   the log up to P in memory *without writing*: the in-memory fold now equals what the views hold.
2. Reading resumes at P + 1; anything at or below the fold's position is skipped (a redelivery).
3. Each batch is written with ``Store.write(expected=position before the batch)``; the fold has moved
   ahead, but the database has not, until that commit.
4. When the write fails on the connection, the batch is kept and retried after a reconnect. If the
   connection died during COMMIT we cannot know whether it landed, so the position is read first: at
   the batch's last sequence it did land; at the old position it did not (retry); anything else means
   another writer moved it, and the projector re-synchronises from step 1.

A message the fold cannot read is quarantined (``rallypoint.events.codec``): the fold keeps it and the
archive gets a row of type ``quarantined`` for it, so the projection never stops on it and stays equal
to every other fold of the log.

An event PostgreSQL refuses to store (``store.DATA_ERRORS``: a NUL in a string, a number out of a
column's range) is quarantined too, never retried forever: the batch that held it is rolled back, the
fold re-synchronised, and its events written one transaction each; the refused one's transaction holds
only its quarantine row (``rally.projection_quarantine``), an archive row of type ``quarantined`` and
the position moved past it. The fold still applies it (it stays equal to every other fold); only that
event's rows are missing from the views. ``/healthz`` is degraded while any is quarantined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from rallypoint.eventlog import LogUnavailable
from rallypoint.events import Event
from rallypoint.events.codec import Quarantined

from .rows import Batch, ReadModel, RecordedLike, RefusedEvent, refusal_batch
from .store import DATA_ERRORS, DEFAULT_NAME, TRANSIENT_ERRORS, PositionMoved, QuarantinedRow, Store

log = logging.getLogger("rallypoint.projection")

Stored = RecordedLike | Quarantined  # what the log holds at one sequence, as the projector reads it

# The quarantined events a projector keeps in memory to name them (in /healthz); it counts all of them.
KEPT_REFUSALS = 20
NAMED_IN_HEALTH = 5

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class LogReader(Protocol):
    """The part of ``rallypoint.eventlog.EventLog`` the projector reads through."""

    async def last_seq(self, subject_filter: str | None = None) -> int: ...
    def replay(
        self,
        *,
        from_seq: int = 1,
        to_seq: int | None = None,
        subjects: str = "rally.>",
        quarantine: Literal[True],
    ) -> AsyncIterator[Stored]: ...
    def follow(
        self, *, from_seq: int, subjects: str = "rally.>", quarantine: Literal[True]
    ) -> AsyncIterator[Stored]: ...


class ProjectionError(Exception):
    """The database and the log disagree in a way a retry cannot fix (e.g. the log was replaced)."""


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Exponential backoff between reconnects; ``give_up_after`` seconds of failure (None: never)."""

    initial: float = 0.1
    maximum: float = 5.0
    give_up_after: float | None = None


class _Stopped(Exception):
    """Raised out of a retry wait when the service is asked to stop: nothing more will be written."""


class _End:
    """Queue marker: the source iterator finished (replay reached its end)."""


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_Item = Stored | _End | _Failed


class Projector:
    """Projects the whole log into the read models of one PostgreSQL database."""

    def __init__(
        self,
        log: LogReader,
        dsn: str,
        *,
        name: str = DEFAULT_NAME,
        batch_size: int = 500,
        batch_wait: float = 0.05,
        snapshot_every: int = 50_000,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.log = log
        self.dsn = dsn
        self.name = name
        self.batch_size = batch_size
        self.batch_wait = batch_wait
        self.snapshot_every = snapshot_every
        self.retry = retry or RetryPolicy()
        self.model = ReadModel()
        self._store: Store | None = None
        self._snapshot_seq = 0
        # False until the fold matches the stored position; run() and catch_up() sync first.
        self._synced = False
        # Set by run(): a backoff wait ends early when the service is stopping.
        self._stop: asyncio.Event | None = None
        # Counters for logs and status; not persisted.
        self.batches_written = 0
        self.events_written = 0
        self.retries = 0
        self.resyncs = 0
        # The events PostgreSQL refused (this projection's quarantine table, read at each sync).
        self.quarantined_total = 0
        self.quarantined: list[RefusedEvent] = []
        # ("job", id) and ("node", id) of the events refused since this projector started: their rows
        # may hold what PostgreSQL refused, so their later events are committed alone (``_apply``).
        self._refused_keys: set[tuple[str, str]] = set()

    @property
    def position(self) -> int:
        """Sequence of the last event committed to PostgreSQL (equal to the fold's between batches)."""
        return self.model.position

    # -- connection ------------------------------------------------------------------------

    async def _connected(self) -> Store:
        if self._store is None:
            self._store = await Store.open(self.dsn, name=self.name)
        return self._store

    async def _drop(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()

    async def _retrying(self, what: str, step: _Step[T]) -> T:
        """Run ``step`` on a live connection, reconnecting with backoff on transient failures."""
        delay = self.retry.initial
        started = time.monotonic()
        while True:
            try:
                return await step(await self._connected())
            except TRANSIENT_ERRORS as exc:
                await self._drop()
                self.retries += 1
                waited = time.monotonic() - started
                if self.retry.give_up_after is not None and waited >= self.retry.give_up_after:
                    raise
                log.warning(
                    "%s: PostgreSQL unavailable (%s: %s); retrying in %.1fs",
                    what,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                if self._stop is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                    if self._stop.is_set():
                        raise _Stopped() from exc
                delay = min(delay * 2, self.retry.maximum)

    async def close(self) -> None:
        await self._drop()

    # -- start-up --------------------------------------------------------------------------

    async def sync(self) -> int:
        """Rebuild the in-memory fold to exactly the stored position, without writing anything."""
        position, snapshot, (total, refused) = await self._retrying("sync", _read_stored_state)
        log_last = await self.log.last_seq()
        if position > log_last:
            raise ProjectionError(
                f"projection {self.name!r} is at seq {position} but the log ends at {log_last}: the "
                "stream was replaced; run `rally projector rebuild`"
            )
        model = ReadModel()
        if snapshot is not None and snapshot[0] <= position:
            try:
                model = ReadModel.decode(snapshot[1])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # A snapshot from an older fold layout: the log is the truth, so fold it from zero.
                log.warning("ignoring unreadable snapshot at seq %d: %s", snapshot[0], exc)
                model = ReadModel()
        if model.position < position:
            async for rec in self.log.replay(from_seq=model.position + 1, to_seq=position, quarantine=True):
                model.apply_stored(rec)
        if model.position != position:
            raise ProjectionError(
                f"projection {self.name!r} is at seq {position} but the log folds only to "
                f"{model.position}: the stream was replaced; run `rally projector rebuild`"
            )
        self.model = model
        self._snapshot_seq = snapshot[0] if snapshot is not None and snapshot[0] <= position else 0
        self._synced = True
        self.quarantined_total, self.quarantined = total, [_refused(row) for row in refused]
        log.info("projection %r synchronised at seq %d", self.name, position)
        return position

    async def follow_stored(self) -> int:
        """A standby's step: bring the in-memory fold up to the position another projector committed,
        writing nothing, so that taking over costs the events since the last step, not a replay from the
        snapshot. Fails (no retry) while PostgreSQL or the log is away; the fold stays exact up to its own
        position either way (each record is applied whole and in order), so the next step goes on."""
        if not self._synced:
            return await self.sync()
        store = await self._connected()
        try:
            position, (total, refused) = await store.position(), await store.quarantined(KEPT_REFUSALS)
        except TRANSIENT_ERRORS:
            await self._drop()
            raise
        if position < self.model.position:
            # Rebuilt under us (`rally projector rebuild`): our fold is ahead of the views now.
            self._synced = False
            return await self.sync()
        if position > self.model.position:
            async for rec in self.log.replay(
                from_seq=self.model.position + 1, to_seq=position, quarantine=True
            ):
                self.model.apply_stored(rec)
        self.quarantined_total, self.quarantined = total, [_refused(row) for row in refused]
        return self.model.position

    async def reset(self, *, keep_archive: bool = False) -> None:
        """Empty the views and the position (``rally projector rebuild``); the fold restarts at zero."""

        async def step(store: Store) -> None:
            await store.reset(keep_archive=keep_archive)

        await self._retrying("reset", step)
        self.model = ReadModel()
        self._snapshot_seq = 0
        self._synced = True
        self.quarantined_total, self.quarantined = 0, []
        self._refused_keys = set()

    def degraded(self) -> list[str]:
        """Why ``/healthz`` says degraded: events PostgreSQL refused, whose rows the views lack."""
        if not self.quarantined_total:
            return []
        named = self.quarantined[:NAMED_IN_HEALTH]
        lines = [f"quarantined {refused.describe()}" for refused in named]
        if self.quarantined_total > len(named):
            lines.append(
                f"{self.quarantined_total - len(named)} more events quarantined; "
                "`rally projector status` lists them"
            )
        return lines

    # -- projecting ------------------------------------------------------------------------

    async def catch_up(self, to_seq: int | None = None) -> int:
        """Project up to ``to_seq`` (default: the log's last sequence now) and return the position."""
        if not self._synced:
            await self.sync()
        target = to_seq if to_seq is not None else await self.log.last_seq()
        while self.position < target:
            try:
                source = self.log.replay(from_seq=self.position + 1, to_seq=target, quarantine=True)
                await self._consume(source, None)
            except PositionMoved as exc:
                await self._resync(exc)
        return self.position

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the live log until ``stop`` is set; every committed batch moves the position.

        Returns after the batch in flight is committed, or at once while PostgreSQL is unreachable
        (the uncommitted batch is simply read again by the next start).
        """
        self._stop = stop
        delay = self.retry.initial
        try:
            while not stop.is_set():
                try:
                    if not self._synced:
                        await self.sync()
                    await self._consume(self.log.follow(from_seq=self.position + 1, quarantine=True), stop)
                except PositionMoved as exc:
                    await self._resync(exc)
                except LogUnavailable as exc:
                    # NATS is away (follow itself rides out reconnects; sync's replay does not).
                    # The fold may be partial: sync again once the log answers.
                    self._synced = False
                    log.warning(
                        "projection %r: event log unavailable (%s); retrying in %.1fs", self.name, exc, delay
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, self.retry.maximum)
                    continue
                delay = self.retry.initial
        except _Stopped:
            log.info("projection %r stopping while PostgreSQL is unreachable", self.name)
        finally:
            self._stop = None

    async def _resync(self, exc: PositionMoved) -> None:
        self.resyncs += 1
        log.warning("%s; re-synchronising from the stored position", exc)
        await self.sync()

    async def _consume(self, source: AsyncIterator[Stored], stop: asyncio.Event | None) -> None:
        # A pump task owns the source iterator: cancelling a pending __anext__ from the batching side
        # would close an async generator mid-read, so the batcher only ever waits on a queue.
        queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=self.batch_size * 4)

        async def pump() -> None:
            try:
                async for rec in source:
                    await queue.put(rec)
                await queue.put(_End())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # handed to the batcher, which raises it where callers look
                await queue.put(_Failed(exc))

        pump_task = asyncio.create_task(pump(), name="projector-pump")
        stop_task = asyncio.create_task(stop.wait()) if stop is not None else None
        getter: asyncio.Task[_Item] | None = None
        try:
            while True:
                records, ended, getter = await self._next_batch(queue, getter, stop_task)
                if records:
                    await self._apply(records)
                if ended or (stop is not None and stop.is_set()):
                    return
        finally:
            for task in (getter, stop_task):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (getter, stop_task) if t is not None), return_exceptions=True)
            await _cancel_until_done(pump_task)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def _next_batch(
        self,
        queue: asyncio.Queue[_Item],
        getter: asyncio.Task[_Item] | None,
        stop_task: asyncio.Task[bool] | None,
    ) -> tuple[list[Stored], bool, asyncio.Task[_Item] | None]:
        """Up to ``batch_size`` records, waiting at most ``batch_wait`` after the first one.

        The pending ``queue.get()`` task survives a timeout and is reused by the next call: cancelling
        it could drop a record it had already taken off the queue.
        """
        records: list[Stored] = []
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while len(records) < self.batch_size:
            if getter is None and not queue.empty():
                # Already there: taken without a task and a wait per record (those were a tenth of the
                # projector's CPU), however late; the window only bounds the wait for more.
                item = queue.get_nowait()
            else:
                if getter is None:
                    getter = asyncio.create_task(queue.get())
                if deadline is None:
                    waiting: set[asyncio.Future[Any]] = {getter}
                    if stop_task is not None:
                        waiting.add(stop_task)
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                else:
                    remaining = deadline - loop.time()
                    if remaining > 0:
                        await asyncio.wait({getter}, timeout=remaining)
                if not getter.done():
                    return records, False, getter  # batch window closed, or stop was set while idle
                item = getter.result()
                getter = None
            if isinstance(item, _End):
                return records, True, None
            if isinstance(item, _Failed):
                if records:
                    # Write what was read before the failure; the error surfaces on the next call.
                    queue.put_nowait(item)
                    return records, False, None
                raise item.error
            records.append(item)
            if deadline is None:
                deadline = loop.time() + self.batch_wait
        return records, False, getter

    async def _apply(self, records: list[Stored]) -> None:
        """Commit a batch in log order, in one transaction where PostgreSQL takes it.

        An event of a job or node whose event PostgreSQL refused before (its row may hold the refused
        value: a NUL in the job's name is in every later row of it) is committed alone, so that a
        refusal of it costs no re-synchronisation; so are the events after a refusal in a batch.
        """
        pending = records
        while pending:
            clean = self._unsuspected_prefix(pending)
            segment, pending = pending[: clean or 1], pending[clean or 1 :]
            pending = await self._commit_segment(segment) + pending

    async def _commit_segment(self, records: list[Stored]) -> list[Stored]:
        """Commit ``records`` in one transaction; if PostgreSQL refuses them, re-synchronise and commit
        them one at a time up to the first refused one, which is quarantined. Returns the records after
        it, not yet committed."""
        try:
            # A batch of one (the usual case while following) is quarantined at once if refused.
            await self._commit(
                _fold_of(self.model, records), refused=records[0] if len(records) == 1 else None
            )
            return []
        except DATA_ERRORS as exc:
            log.warning(
                "projection %r: PostgreSQL refused the batch %d..%d (%s: %s); writing its events one by one",
                self.name,
                records[0].seq,
                records[-1].seq,
                type(exc).__name__,
                _explain(exc),
            )
        await self.sync()  # the failed commit dropped the fold; back to the stored position
        for index, item in enumerate(records):
            refused_before = self.quarantined_total
            await self._commit(_fold_of(self.model, [item]), refused=item)
            if self.quarantined_total > refused_before:
                return records[index + 1 :]
        return []  # none refused alone: the batch failed on rows no single event's write holds

    def _unsuspected_prefix(self, records: list[Stored]) -> int:
        """How many records lead ``records`` before the first that touches a job or node with a refused
        event (all of them while none was refused, the usual case, at no cost per record)."""
        if not self._refused_keys:
            return len(records)
        for index, item in enumerate(records):
            if not isinstance(item, Quarantined) and _row_keys(item.event) & self._refused_keys:
                return index
        return len(records)

    async def _commit(self, fold: Callable[[], Batch | None], *, refused: Stored | None = None) -> None:
        """Fold (``fold`` moves ``self.model``) and write the batch it returns, fenced on the position.

        With ``refused`` (a batch of that one record), a batch PostgreSQL refuses is replaced by the
        record's quarantine: the fold keeps the record applied, the database gets no row of it.
        """
        before = self.model.position
        try:
            batch = fold()
            if batch is None:
                return  # every record was a redelivery at or below the position
            snapshot = None
            if self.snapshot_every > 0 and batch.last_seq - self._snapshot_seq >= self.snapshot_every:
                snapshot = self.model.encode()
            try:
                await self._write(batch, before, snapshot)
            except DATA_ERRORS as exc:
                if refused is None:
                    raise
                batch = self._quarantine(refused, exc)
                await self._write(batch, before, snapshot)
        except BaseException:
            # The fold moved ahead of what may have been committed; never keep it (a cancelled task or
            # a non-transient error leaves an unknown commit state). The next sync re-reads the truth.
            self.model = ReadModel()
            self._snapshot_seq = 0
            self._synced = False
            raise
        if snapshot is not None:
            self._snapshot_seq = batch.last_seq
        self.batches_written += 1
        self.events_written += len(batch.events)
        self._count_quarantined(batch)

    def _quarantine(self, item: Stored, exc: BaseException) -> Batch:
        refused = RefusedEvent.of(item, _explain(exc))
        if not isinstance(item, Quarantined):
            self._refused_keys |= _row_keys(item.event)
        log.warning("projection %r: quarantined %s", self.name, refused.describe(), extra={"seq": item.seq})
        return refusal_batch(item, refused)

    def _count_quarantined(self, batch: Batch) -> None:
        for seq, subject, tag, error, _data in batch.quarantined:
            self.quarantined_total += 1
            if len(self.quarantined) < KEPT_REFUSALS:
                self.quarantined.append(RefusedEvent(seq=seq, subject=subject, event_type=tag, error=error))

    async def _write(self, batch: Batch, before: int, snapshot: bytes | None) -> None:
        uncertain = False

        async def step(store: Store) -> None:
            nonlocal uncertain
            if uncertain:
                found = await store.position()
                if found == batch.last_seq:
                    return  # the COMMIT landed before the connection died
                if found != before:
                    raise PositionMoved(before, found)
            uncertain = True  # from here on a connection failure leaves the commit in doubt
            await store.write(batch, expected=before, snapshot=snapshot)

        await self._retrying(f"batch {batch.first_seq}..{batch.last_seq}", step)


async def _cancel_until_done(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it, cancelling again if a cancellation gets lost.

    Seen in tests (about 1 run in 15 with two projectors re-synchronising): the pump kept waiting
    for messages inside ``follow`` with its cancel request consumed. The likely culprit is Python
    3.11's ``asyncio.wait_for``, which drops a cancellation that arrives as its inner future completes
    (fixed in 3.12), and nats-py awaits every request (subscribe included) through it.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    if not task.cancelled() and task.exception() is not None:
        log.debug("pump ended with %r", task.exception())


def _fold_of(model: ReadModel, records: list[Stored]) -> Callable[[], Batch | None]:
    """``model.fold(records)``, for ``Projector._commit`` to run."""
    return lambda: model.fold(records)


def _explain(exc: BaseException) -> str:
    """PostgreSQL's refusal in one line: its class, SQLSTATE, message and detail (which names the value)."""
    sqlstate = getattr(exc, "sqlstate", None)
    message = getattr(exc, "message", None) or str(exc)  # str() of asyncpg's adds the detail on a new line
    detail = getattr(exc, "detail", None)
    text = type(exc).__name__ + (f" (SQLSTATE {sqlstate})" if sqlstate else "") + f": {message}"
    return " ".join((text + (f" ({detail})" if detail else "")).split())


def _row_keys(event: Event) -> set[tuple[str, str]]:
    """The job and node whose rows an event names (a bind's other nodes are not among them)."""
    keys = set()
    for kind in ("job", "node"):
        value = getattr(event, f"{kind}_id", None)
        if isinstance(value, str):
            keys.add((kind, value))
    return keys


def _refused(row: QuarantinedRow) -> RefusedEvent:
    return RefusedEvent(seq=row.seq, subject=row.subject, event_type=row.type, error=row.error)


class _Step(Protocol[T_co]):
    async def __call__(self, store: Store, /) -> T_co: ...


async def _read_stored_state(
    store: Store,
) -> tuple[int, tuple[int, bytes] | None, tuple[int, list[QuarantinedRow]]]:
    """The position, the snapshot and the quarantined events (counted, the first few named)."""
    return await store.position(), await store.snapshot(), await store.quarantined(KEPT_REFUSALS)
