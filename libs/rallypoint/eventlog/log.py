"""The event log: one JetStream stream, conditional appends, gapless replay and a live follow.

See docs/architecture.md ("The log", "eventlog") for the contract. Design notes:

- ``append`` maps JetStream's answers onto three outcomes callers can act on: a sequence number, an
  ``AppendConflict`` (the guard failed: re-read and decide again, or step down), or ``LogUnavailable``
  (nothing is known: retry with the same ``msg_id``).
- The server checks ``Nats-Expected-Last-Subject-Sequence`` *before* de-duplicating by ``Nats-Msg-Id``,
  so a retried conditional append whose first attempt landed comes back as 10071. ``append`` then
  looks at the last message on the guarded subject (tree): if it carries the same ``Nats-Msg-Id``, the
  retry is reported as a duplicate success instead of a conflict.
- ``replay`` trusts nothing it does not check: it records the target sequence first, checks every
  sequence it receives, and raises ``LogGap`` rather than returning a short history.
- ``append_batch`` stores up to ``MAX_BATCH`` events all or nothing (JetStream atomic batch publish,
  ADR-50; the stream has ``allow_atomic``). The messages are pipelined without waiting, the commit is
  one request, and the expected sequence rides on the first message: the server checks it against the
  stream as it was before the batch, so one stale fence refuses the whole batch.
- A stored message this version cannot decode raises ``UndecodableEvent`` by default. Folds pass
  ``quarantine=True`` instead and get a ``Quarantined`` record in its place (logged as an ERROR naming
  its sequence), so that no message can stop a service: see ``rallypoint.events.codec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import NamedTuple, Protocol, Self

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import PubAck, RawStreamMsg, StorageType, StreamConfig
from nats.js.client import JetStreamContext

from rallypoint.events import Event, decode, encode, envelope_from_headers, envelope_headers
from rallypoint.events.codec import Quarantined, decode_stored
from rallypoint.events.subjects import STREAM_SUBJECTS
from rallypoint.observability.tracing import trace_headers

from .connection import FastHeadersClient, NatsCredentials, connect_nats
from .errors import (
    BATCH_CONFLICT_CODES,
    BATCH_TOO_LARGE,
    CONFLICT_CODES,
    AppendConflict,
    BatchTooLarge,
    LogGap,
    LogUnavailable,
    UndecodableEvent,
)
from .feeds import Delivery, DirectFeed, Feed, FeedReset, LazyEnvelope, OrderedFeed

_log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SUBJECT_FILTER = "Nats-Expected-Last-Subject-Sequence-Subject"
DUPLICATE_WINDOW_S = 120.0
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
#: The messages of one atomic batch our servers take: every config we ship sets nats-server's
#: ``jetstream.limits.batch.max_msgs`` to this (deploy/nats, deploy/k8s, the embedded server), so a
#: scheduler cycle of a few thousand decisions is one batch, one round trip and one fence.
MAX_BATCH = 5000
#: nats-server's own default (ADR-50; 1,001 is refused with 10199 on 2.15.1): a server left at it refuses
#: a larger batch whole, and ``EventLog`` then keeps to the limit the refusal names.
SERVER_DEFAULT_BATCH = 1000
#: JetStream answers that mean "not decided yet" (10158: a message with this Nats-Msg-Id is in process;
#: seen on 2.15.1 after a quorum loss, tests/integration/test_quorum.py).
PENDING_CODES = frozenset({10158})

# Errors that mean "the log did not answer", as opposed to "the log said no".
_UNAVAILABLE = (
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.TimeoutError,
    TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
)


class Recorded(msgspec.Struct, frozen=True):
    """An event as stored: its stream sequence, subject, decoded event and CloudEvents attributes (from a
    follow or a replay, a ``LazyEnvelope``: parsed when first read)."""

    seq: int
    subject: str
    event: Event
    envelope: Mapping[str, str]


class AppendResult(NamedTuple):
    seq: int
    duplicate: bool  # True when this append was recognised as a retry of one already stored


class Entry(Protocol):
    """One event to append: what ``append_batch`` takes (``Append``, or any struct with these fields)."""

    @property
    def subject(self) -> str: ...
    @property
    def event(self) -> Event: ...
    @property
    def msg_id(self) -> str: ...


class Append(NamedTuple):
    subject: str
    event: Event
    msg_id: str


class BatchResult(NamedTuple):
    """Where an atomic batch landed: its events hold the contiguous sequences first_seq..last_seq."""

    first_seq: int
    last_seq: int
    duplicate: bool  # True when the batch was recognised as a retry of one already stored


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    """A JetStream publish acknowledgement, as far as an append reads it (``error``: an error the answer
    carries instead, raw; empty when none)."""

    stream: str
    seq: int
    duplicate: bool | None = None
    error: msgspec.Raw = msgspec.Raw(b"")


_pub_ack_decoder = msgspec.json.Decoder(_PubAck)


class _BatchAck(msgspec.Struct):
    """The server's answer to a batch commit: the last event's sequence, or why the batch was refused."""

    seq: int = 0
    error: _ApiError | None = None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


def _is_stored(raw: RawStreamMsg, entry: Entry) -> bool:
    """Whether a stored message is ``entry``: its message id and its encoded event."""
    headers = raw.headers or {}
    return headers.get(MSG_ID) == entry.msg_id and raw.data == encode(entry.event)


def _event_time(event: Event) -> float:
    at = getattr(event, "at", None)
    if at is None:
        at = getattr(event, "submitted_at", None)
    return float(at) if at is not None else time.time()


def stored(item: Recorded | Quarantined) -> Event | Quarantined:
    """What a fold applies for one stored message (``ClusterState.apply_stored``)."""
    return item if isinstance(item, Quarantined) else item.event


def _to_recorded(delivery: Delivery, quarantine: bool) -> Recorded | Quarantined:
    seq, subject = delivery.seq, delivery.subject
    item = decode_stored(delivery.data, seq=seq, subject=subject)
    if isinstance(item, Quarantined):
        if not quarantine:
            raise UndecodableEvent(seq, subject, f"{item.reason}: {item.error}")
        _log.error("quarantined the message at %s", item.describe(), extra={"seq": seq})
        return item
    raw = delivery.raw_headers
    envelope = envelope_from_headers(delivery.headers) if raw is None else LazyEnvelope(raw)
    return Recorded(seq=seq, subject=subject, event=item, envelope=envelope)


class EventLog:
    """Client of the ``RALLY`` stream. Build with ``connect`` (own connection) or ``attach`` (shared)."""

    def __init__(
        self, nc: Client, *, stream: str = "RALLY", owns_connection: bool = False, timeout: float = 5.0
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=timeout)
        self.stream = stream
        self.timeout = timeout
        self._owns_connection = owns_connection
        #: the largest atomic batch to send: ``MAX_BATCH`` until a server says its limit is lower
        self.max_batch = MAX_BATCH

    @classmethod
    async def connect(
        cls,
        url: str | list[str],
        *,
        name: str,
        stream: str = "RALLY",
        replicas: int = 1,
        create: bool = True,
        initial_timeout: float | None = 10.0,
        credentials: NatsCredentials | None = None,
    ) -> Self:
        nc = await connect_nats(url, name=name, initial_timeout=initial_timeout, credentials=credentials)
        try:
            return await cls.attach(nc, stream=stream, replicas=replicas, create=create, owns_connection=True)
        except BaseException:
            await nc.close()
            raise

    @classmethod
    async def attach(
        cls,
        nc: Client,
        *,
        stream: str = "RALLY",
        replicas: int = 1,
        create: bool = True,
        owns_connection: bool = False,
    ) -> Self:
        """An EventLog on an existing connection (a service shares one connection for everything)."""
        log = cls(nc, stream=stream, owns_connection=owns_connection)
        if create:
            await log.ensure_stream(replicas=replicas)
        else:
            try:
                await log.js.stream_info(stream)
            except nats.js.errors.NotFoundError as exc:
                raise LogUnavailable(f"stream {stream} does not exist") from exc
        return log

    def stream_config(self, replicas: int = 1) -> StreamConfig:
        return StreamConfig(
            name=self.stream,
            subjects=[STREAM_SUBJECTS],
            storage=StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
            allow_direct=True,
            allow_atomic=True,  # lets a later change append several events all-or-nothing
            duplicate_window=DUPLICATE_WINDOW_S,
        )

    async def ensure_stream(self, *, replicas: int = 1) -> None:
        """Create the stream, or bring an existing one to our configuration (idempotent)."""
        wanted = self.stream_config(replicas)
        try:
            info = await self.js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            try:
                await self.js.add_stream(wanted)
                return
            except nats.js.errors.BadRequestError:
                # Another process created it between our two calls; fall through and compare.
                info = await self.js.stream_info(self.stream)
        have = info.config
        fields = (
            "subjects",
            "num_replicas",
            "deny_delete",
            "deny_purge",
            "allow_direct",
            "allow_atomic",
            "duplicate_window",
        )
        if any(getattr(have, f) != getattr(wanted, f) for f in fields):
            _log.info("updating stream %s configuration", self.stream)
            await self.js.update_stream(wanted)

    async def close(self) -> None:
        """Drain (deliver what is in flight) and close our own connection; a shared one is left open."""
        if not self._owns_connection or self.nc.is_closed:
            return
        # nats-py raises from drain()/close() when the server is already gone (ConnectionResetError);
        # closing must still succeed then.
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.close()

    # -- writing -----------------------------------------------------------------------------------

    async def append(
        self,
        subject: str,
        event: Event,
        *,
        msg_id: str,
        source: str,
        expected_last_subject_seq: int | None = None,
        expected_subject_filter: str | None = None,
    ) -> int:
        """Append one event; returns its stream sequence (the original one for a duplicate)."""
        result = await self.append_ack(
            subject,
            event,
            msg_id=msg_id,
            source=source,
            expected_last_subject_seq=expected_last_subject_seq,
            expected_subject_filter=expected_subject_filter,
        )
        return result.seq

    async def append_ack(
        self,
        subject: str,
        event: Event,
        *,
        msg_id: str,
        source: str,
        expected_last_subject_seq: int | None = None,
        expected_subject_filter: str | None = None,
    ) -> AppendResult:
        """``append`` that also says whether the event was already stored (a retried append)."""
        if expected_subject_filter is not None and expected_last_subject_seq is None:
            raise ValueError("expected_subject_filter needs expected_last_subject_seq")
        headers = envelope_headers(
            event, event_id=msg_id, source=source, subject=subject, at=_event_time(event)
        )
        headers[MSG_ID] = msg_id
        headers.update(trace_headers())  # the trace this append belongs to, if any (docs/observability.md)
        if expected_last_subject_seq is not None:
            headers[EXPECTED_SUBJECT_SEQ] = str(expected_last_subject_seq)
        if expected_subject_filter is not None:
            headers[EXPECTED_SUBJECT_FILTER] = expected_subject_filter
        try:
            seq, duplicate = await self._js_publish(subject, encode(event), headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code in CONFLICT_CODES:
                landed = await self._stored_as_last(expected_subject_filter or subject, msg_id)
                if landed is not None:
                    return AppendResult(landed, True)
                raise AppendConflict(int(exc.err_code or 0), exc.description or "") from exc
            if exc.err_code in PENDING_CODES:
                # The server still holds an earlier attempt of this message (proposed while the stream had
                # no quorum, committed once it has): nothing is known yet, so the caller retries (503).
                raise LogUnavailable(f"append to {subject}: {exc.description}") from exc
            raise
        except _UNAVAILABLE as exc:
            raise LogUnavailable(f"append to {subject} got no answer: {type(exc).__name__}") from exc
        return AppendResult(seq, duplicate)

    async def _js_publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> tuple[int, bool]:
        """``JetStreamContext.publish`` to our stream: (sequence, duplicate), or what it raises.

        nats-py reads every answer with the json module into a dataclass (~4 us of an append's ~50); a plain
        acknowledgement is read here with msgspec, anything else (an error, an answer of another shape) by
        nats-py's own code, so that what it raises is unchanged."""
        headers[nats.js.api.Header.EXPECTED_STREAM] = self.stream
        try:
            msg = await self.nc.request(subject, payload, timeout=self.timeout, headers=headers)
        except nats.errors.NoRespondersError as exc:
            raise nats.js.errors.NoStreamResponseError from exc
        try:
            ack = _pub_ack_decoder.decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            ack = None
        if ack is not None and not ack.error:
            return ack.seq, bool(ack.duplicate)
        answer = json.loads(msg.data)
        if "error" in answer:
            raise nats.js.errors.APIError.from_error(answer["error"])
        read = PubAck.from_response(answer)
        return read.seq, bool(read.duplicate)

    async def append_batch(
        self,
        entries: Sequence[Entry],
        *,
        source: str,
        expected_last_subject_seq: int | None = None,
        expected_subject_filter: str | None = None,
    ) -> BatchResult:
        """Append ``entries`` (1..``max_batch``) in order, all or none, guarded like ``append``.

        Outcomes as for ``append``: the sequences; ``AppendConflict`` when the guard failed or a
        message id is already stored by a batch that is not this one's earlier attempt; or
        ``LogUnavailable`` (nothing is known: the batch may have landed; a retry with the same
        message ids is recognised as a duplicate); or ``BatchTooLarge`` (nothing stored; ``max_batch``
        is lowered to the server's limit, so the caller splits the batch and sends it again).
        """
        if not 0 < len(entries) <= self.max_batch:
            raise ValueError(f"an atomic batch holds 1..{self.max_batch} events, not {len(entries)}")
        if expected_subject_filter is not None and expected_last_subject_seq is None:
            raise ValueError("expected_subject_filter needs expected_last_subject_seq")
        guard: dict[str, str] = {}
        if expected_last_subject_seq is not None:
            guard[EXPECTED_SUBJECT_SEQ] = str(expected_last_subject_seq)
        if expected_subject_filter is not None:
            guard[EXPECTED_SUBJECT_FILTER] = expected_subject_filter
        try:
            ack = await self._publish_batch(entries, source, guard)
        except _UNAVAILABLE as exc:
            raise LogUnavailable(f"batch of {len(entries)} got no answer: {type(exc).__name__}") from exc
        if ack.error is None:
            return BatchResult(ack.seq - len(entries) + 1, ack.seq, False)
        return await self._batch_refused(entries, ack.error)

    async def _publish_batch(self, entries: Sequence[Entry], source: str, guard: dict[str, str]) -> _BatchAck:
        """Publish the batch without waiting for answers, then commit it with one request."""
        batch_id = uuid.uuid4().hex
        last = len(entries)
        for n, entry in enumerate(entries, 1):
            headers = envelope_headers(
                entry.event,
                event_id=entry.msg_id,
                source=source,
                subject=entry.subject,
                at=_event_time(entry.event),
            )
            headers[MSG_ID] = entry.msg_id
            headers.update(trace_headers())
            headers[BATCH_ID] = batch_id
            headers[BATCH_SEQUENCE] = str(n)
            if n == 1:
                headers.update(guard)
            data = encode(entry.event)
            if n < last:
                await self.nc.publish(entry.subject, data, headers=headers)
                continue
            headers[BATCH_COMMIT] = "1"
            reply = await self.nc.request(entry.subject, data, headers=headers, timeout=self.timeout)
            return msgspec.json.decode(reply.data, type=_BatchAck)
        raise AssertionError("unreachable: entries is not empty")

    async def _batch_refused(self, entries: Sequence[Entry], error: _ApiError) -> BatchResult:
        """Map a refused batch to an outcome: an earlier attempt of it landed, a conflict, or unknown."""
        code, description = error.err_code, error.description
        if code == BATCH_TOO_LARGE and (limit := _batch_limit(description)) < len(entries):
            _log.warning("the server takes atomic batches of at most %d events: sending no more", limit)
            self.max_batch = limit
            raise BatchTooLarge(limit, len(entries))
        if code in BATCH_CONFLICT_CODES:
            landed = await self._landed(entries)
            if landed is not None:
                return BatchResult(landed - len(entries) + 1, landed, True)
            raise AppendConflict(code, description)
        if code in PENDING_CODES:
            raise LogUnavailable(f"batch of {len(entries)}: {description}")
        raise nats.js.errors.APIError(
            code=error.code or None,
            err_code=code or None,
            description=description,
            stream=self.stream,
        )

    async def _landed(self, entries: Sequence[Entry]) -> int | None:
        """The last sequence of an earlier attempt of this very batch, if one is stored; else None.

        A batch lands whole on contiguous sequences, so its first and last events are checked, by
        message id and by content: another writer's batch may reuse an id (two leaders' identical
        ``JobPending``) with other content (its epoch), and must not pass for ours."""
        tail, head = entries[-1], entries[0]
        try:
            last = await self.js.get_msg(self.stream, subject=tail.subject)
            if last.seq is None or not _is_stored(last, tail):
                return None
            first = await self.js.get_msg(self.stream, seq=last.seq - len(entries) + 1)
        except (nats.js.errors.NotFoundError, *_UNAVAILABLE):
            return None
        return int(last.seq) if _is_stored(first, head) else None

    async def _stored_as_last(self, subject_filter: str, msg_id: str) -> int | None:
        """Seq of the last message on the filter if it carries ``msg_id`` (our earlier attempt landed)."""
        try:
            raw = await self.js.get_msg(self.stream, subject=subject_filter)
        except (nats.js.errors.NotFoundError, *_UNAVAILABLE):
            return None
        if raw.headers and raw.headers.get(MSG_ID) == msg_id and raw.seq is not None:
            return int(raw.seq)
        return None

    # -- reading -----------------------------------------------------------------------------------

    async def last_seq(self, subject_filter: str | None = None) -> int:
        """Last stream sequence, or the last sequence stored on a subject / wildcard filter (0: none).

        Answered by the stream leader (not a direct get, which a lagging replica may serve), so a
        value read here can be used as an expected sequence or a replay target.
        """
        try:
            if subject_filter is None or subject_filter == STREAM_SUBJECTS:
                info = await self.js.stream_info(self.stream)
                return int(info.state.last_seq)
            try:
                raw = await self.js.get_msg(self.stream, subject=subject_filter)
            except nats.js.errors.NotFoundError:
                return 0
            return int(raw.seq or 0)
        except _UNAVAILABLE as exc:
            raise LogUnavailable(f"last_seq({subject_filter}) got no answer") from exc

    async def get(self, seq: int) -> Recorded:
        """One stored event by sequence."""
        raw = await self.js.get_msg(self.stream, seq=seq)
        data = raw.data or b""
        try:
            event = decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UndecodableEvent(seq, raw.subject or "", str(exc)) from exc
        return Recorded(
            seq=seq, subject=raw.subject or "", event=event, envelope=envelope_from_headers(raw.headers)
        )

    async def _open_feed(self, from_seq: int, subjects: str) -> Feed:
        """An ordered push consumer over ``subjects`` from ``from_seq``: read straight off the connection
        when it is ours (``DirectFeed``), else through nats-py's ordered consumer."""
        feed: DirectFeed | OrderedFeed
        if isinstance(self.nc, FastHeadersClient):
            feed = DirectFeed(self.nc, self.js, self.stream)
        else:
            feed = OrderedFeed(self.js, self.stream)
        await feed.open(subjects, from_seq)
        return feed

    async def _open_feed_within(self, from_seq: int, subjects: str, within: float) -> Feed:
        """``_open_feed``, asked again while the server cannot answer (a meta leader being elected after a
        server died: creating a consumer times out meanwhile), for up to ``within`` seconds; then
        ``LogUnavailable``."""
        deadline = time.monotonic() + within
        backoff = 0.1
        while True:
            try:
                return await self._open_feed(from_seq, subjects)
            except (nats.js.errors.APIError, *_UNAVAILABLE) as exc:
                if time.monotonic() + backoff >= deadline:
                    raise LogUnavailable(f"no consumer on {subjects} from seq {from_seq}: {exc!r}") from exc
                _log.info("replay of %s: no consumer yet (%r); asking again", subjects, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def replay(
        self,
        *,
        from_seq: int = 1,
        to_seq: int | None = None,
        subjects: str = STREAM_SUBJECTS,
        stall_timeout: float = 10.0,
        quarantine: bool = False,
    ) -> AsyncIterator[Recorded | Quarantined]:
        """Every event in [from_seq, to_seq or the last seq recorded when called], in order, or LogGap.

        Over the whole stream sequences must be contiguous; with a narrower ``subjects`` filter they
        jump, and the replay must still reach the last sequence stored on that filter. A message that
        cannot be decoded raises ``UndecodableEvent``, or with ``quarantine`` comes as a ``Quarantined``.
        """
        whole = subjects == STREAM_SUBJECTS
        info = await self._stream_info()
        stream_last, stream_first = int(info.state.last_seq), int(info.state.first_seq)
        if to_seq is not None and to_seq > stream_last:
            raise LogGap(f"replay to seq {to_seq} asked for, the log ends at {stream_last}")
        end = stream_last if to_seq is None else to_seq
        if whole:
            from_seq = max(from_seq, stream_first)
        # The last sequence on the filter, recorded before consuming: the replay must reach it. When
        # it lies beyond ``end`` the replay instead stops at the first message past ``end``.
        filter_last = stream_last if whole else await self.last_seq(subjects)
        stop_beyond = filter_last > end
        target = min(filter_last, end)
        if from_seq > end or (not stop_beyond and target < from_seq):
            return
        limit = end if stop_beyond else target
        feed = await self._open_feed_within(from_seq, subjects, stall_timeout)
        last = from_seq - 1
        try:
            while True:
                try:
                    batch = await feed.batch(stall_timeout)
                except TimeoutError as exc:
                    raise LogGap(f"replay of {subjects} stalled after seq {last}, target {target}") from exc
                except FeedReset as reset:
                    _log.warning("replay of %s: %s; resubscribing at %d", subjects, reset, last + 1)
                    await feed.close()
                    feed = await self._open_feed_within(last + 1, subjects, stall_timeout)
                    continue
                for delivery in batch:
                    seq = delivery.seq
                    if seq <= last:
                        continue  # redelivered after an ordered-consumer reset
                    if whole and seq != last + 1:
                        raise LogGap(f"replay expected seq {last + 1}, got {seq}")
                    if seq > limit:
                        if stop_beyond:
                            return
                        raise LogGap(
                            f"replay of {subjects} jumped from {last} past its target {target} to {seq}"
                        )
                    yield _to_recorded(delivery, quarantine)
                    last = seq
                    if seq == target and not stop_beyond:
                        return
        finally:
            await feed.close()

    async def follow(
        self,
        *,
        from_seq: int,
        subjects: str = STREAM_SUBJECTS,
        probe_interval: float = 5.0,
        quarantine: bool = False,
    ) -> AsyncIterator[Recorded | Quarantined]:
        """Events from ``from_seq`` on, live, forever; survives reconnects and server restarts.

        When idle for ``probe_interval`` it asks the stream whether it has missed something (a consumer
        lost with a restarted server, a silent skip) and resubscribes from the next sequence if so.
        Undecodable messages are handled as in ``replay``.
        """
        whole = subjects == STREAM_SUBJECTS
        next_seq = max(1, from_seq)
        backoff = 0.1
        while True:
            try:
                feed = await self._open_feed(next_seq, subjects)
            except (nats.js.errors.APIError, *_UNAVAILABLE) as exc:
                _log.warning("follow %s: cannot subscribe at seq %d (%s); retrying", subjects, next_seq, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            try:
                resubscribe = False
                while not resubscribe:
                    try:
                        batch = await feed.batch(probe_interval)
                    except FeedReset as reset:
                        _log.warning("follow %s: %s; resubscribing at %d", subjects, reset, next_seq)
                        break
                    except TimeoutError:
                        try:
                            stored = await self.last_seq(None if whole else subjects)
                        except LogUnavailable:
                            continue
                        if stored >= next_seq:
                            _log.warning(
                                "follow %s: idle but the log has seq %d; resubscribing at %d",
                                subjects,
                                stored,
                                next_seq,
                            )
                            break
                        continue
                    for delivery in batch:
                        seq = delivery.seq
                        if seq < next_seq:
                            continue
                        if whole and seq != next_seq:
                            _log.warning("follow: expected seq %d, got %d; resubscribing", next_seq, seq)
                            resubscribe = True
                            break
                        yield _to_recorded(delivery, quarantine)
                        next_seq = seq + 1
            finally:
                await feed.close()

    async def _stream_info(self) -> nats.js.api.StreamInfo:
        try:
            return await self.js.stream_info(self.stream)
        except _UNAVAILABLE as exc:
            raise LogUnavailable(f"stream {self.stream} info got no answer") from exc


def _batch_limit(description: str) -> int:
    """The limit a "batch is too large: N" refusal names (nats-server's default when it names none)."""
    found = re.search(r"(\d+)\s*$", description)
    return int(found.group(1)) if found else SERVER_DEFAULT_BATCH
