"""How a replay or a live follow receives the stream's messages: an ordered push consumer, read two ways.

Every service receives every event of the log, so what one delivery costs is paid ten times over at
12,500 nodes. nats-py's ordered consumer (``OrderedFeed``) hands each message through its general
machinery: a ``Msg`` built, the headers parsed by a coroutine, the reply subject parsed twice for the
consumer's bookkeeping, then a queue and a task per subscription before our callback runs: 12-13 us of
CPU per message here. ``DirectFeed`` runs the same consumer protocol itself on a plain subscription whose
messages the connection hands over as they are parsed (``FastHeadersClient.direct``), with nothing else in
between.

The protocol ``DirectFeed`` keeps (what the server expects of an ordered push consumer):

- the consumer: ephemeral, in memory, one replica, no acks, starting at a stream sequence, delivering to a
  fresh inbox that is subscribed *before* the consumer exists (nothing can be delivered unheard), with
  flow control and idle heartbeats; the server deletes it once nobody listens on the inbox;
- ordering: each message's delivery sequence (in its reply subject) must follow the last one; a jump means
  something was lost, and the feed raises ``FeedReset`` so the caller resubscribes from its last stream
  sequence (the same answer as to a stream-sequence gap);
- heartbeats: one naming a later delivery than the last received is a loss too, and so is silence for
  three heartbeat periods (a server restarted without the consumer); one naming a "stalled" subject is
  answered there;
- flow control: a request is answered once the messages before it are buffered, and held while the buffer
  is full, so a slow fold makes the server wait instead of filling memory (the callback feed's
  backpressure, done by the server).

A connection that is not our client (``attach`` of a plain nats-py one) uses ``OrderedFeed``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from rallypoint.events.codec import envelope_from_headers

from .connection import FastHeadersClient, message_headers

_log = logging.getLogger(__name__)

#: Seconds between the server's heartbeats on an idle consumer (nats-py's ordered consumer uses 5).
IDLE_HEARTBEAT_S = 2.0
#: Messages buffered before a flow control request waits for the reader.
BUFFER_LIMIT = 8192
_STATUS = b"NATS/1.0 100"
_LAST_CONSUMER = "Nats-Last-Consumer"
_STALLED = "Nats-Consumer-Stalled"


class Delivery(NamedTuple):
    """One stored message as delivered: its stream sequence, subject, payload and headers: parsed
    (``OrderedFeed``), or the raw block after ``NATS/1.0`` (``DirectFeed``), parsed only if someone reads
    them (``header_fields``, ``LazyEnvelope``)."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None
    raw_headers: bytes | None = None
    #: when the server stored it, from the delivery's reply subject (``DirectFeed``; 0 where not read)
    stored_ns: int = 0

    def header_fields(self) -> dict[str, str] | None:
        """The message's headers as nats-py parses them (None: none)."""
        return self.headers if self.raw_headers is None else message_headers(self.raw_headers)


class LazyEnvelope(Mapping[str, str]):
    """A delivered event's CloudEvents attributes (``envelope_from_headers``), parsed from its raw header
    block when first read. The fold needs the event alone, and parsing a message's ~10 headers cost every
    follower ~9 us per event, most of its receive; only the projector (every event) and the job traces (a
    submission's trace parent) read them."""

    __slots__ = ("_fields", "_raw")

    def __init__(self, raw: bytes | None) -> None:
        self._raw = raw
        self._fields: dict[str, str] | None = None

    def _parsed(self) -> dict[str, str]:
        fields = self._fields
        if fields is None:
            fields = self._fields = envelope_from_headers(message_headers(self._raw))
            self._raw = None
        return fields

    def __getitem__(self, key: str) -> str:
        return self._parsed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())

    def get(self, key: str, default: Any = None) -> Any:  # Mapping's raises and catches KeyError
        return self._parsed().get(key, default)

    def __repr__(self) -> str:
        return repr(self._parsed())


class FeedReset(Exception):
    """The consumer lost its order (a delivery or a heartbeat showed a message missing): resubscribe from
    the last stream sequence taken."""


class Feed(Protocol):
    async def batch(self, timeout: float) -> list[Delivery]:
        """Everything delivered since the last call, waiting up to ``timeout`` for at least one message
        (TimeoutError); ``FeedReset`` once the consumer lost its order (after what came before it)."""
        ...

    async def close(self) -> None: ...


class AckFields(NamedTuple):
    """What a JetStream delivery's reply subject says of the message."""

    stream_seq: int
    delivery_seq: int
    stored_ns: int  # when the server stored it


def ack_fields(reply: str | bytes) -> AckFields | None:
    """The fields of a JetStream delivery's reply subject, as text or as the bytes the connection received;
    None if it is not one. ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>``, or
    with a domain and an account hash after ``ACK`` (and maybe a random token last)."""
    tokens = reply.split(".") if isinstance(reply, str) else reply.split(b".")
    if len(tokens) == 9:
        return AckFields(int(tokens[5]), int(tokens[6]), int(tokens[7]))
    if len(tokens) >= 11:
        return AckFields(int(tokens[7]), int(tokens[8]), int(tokens[9]))
    return None


def stream_seq(msg: Msg) -> int:
    """A nats-py message's stream sequence, without nats-py's slower metadata parse."""
    found = ack_fields(msg.reply) if msg.reply else None
    return found.stream_seq if found is not None else int(msg.metadata.sequence.stream)


class _Buffer:
    """Between the connection's reader and the consumer: a queue with one waiter and one timer.

    A live follow waits here once per batch, so the wait's timeout is one timer for all waits, moved only
    when it fires before the current wait's deadline, rather than ``asyncio.timeout``'s timer per wait
    (which cost ~6 us per event in every service).
    """

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[Any]:
        out = list(self.items)
        self.items.clear()
        return out

    async def wait(self, timeout: float) -> None:
        """Until ``wake`` (an item, or something else to look at), or TimeoutError after ``timeout``."""
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + timeout
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()  # a shorter timeout than the timer's: it must fire sooner
            self._timer = None
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._expire)
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _expire(self) -> None:
        """The timer: end the wait whose deadline has passed, or fire again at the current wait's."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait sets the timer again
        loop = waiter.get_loop()
        if loop.time() >= self._deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(self._deadline, self._expire)


class _Feed:
    """nats-py's ordered consumer's callback side: a buffer with backpressure.

    A callback subscription, not ``next_msg``: nats-py's ``next_msg`` costs two tasks per message
    (~10k msgs/s here) and its ``messages`` iterator answers flow control only every 0.25 s; the
    callback path answers it at once. When the buffer is full the callback waits, nats-py's own queue
    fills, and the server's flow control holds further deliveries back.
    """

    def __init__(self, limit: int = BUFFER_LIMIT) -> None:
        self._buffer = _Buffer()
        self._space = asyncio.Event()
        self._space.set()
        self._limit = limit

    async def cb(self, msg: Msg) -> None:
        self._buffer.put(msg)
        if len(self._buffer.items) >= self._limit:
            self._space.clear()
            await self._space.wait()

    async def batch(self, timeout: float) -> list[Msg]:
        """Everything buffered, waiting up to ``timeout`` for at least one message (else TimeoutError)."""
        if not self._buffer.items:
            await self._buffer.wait(timeout)
        out: list[Msg] = self._buffer.take()
        self._space.set()
        return out


class OrderedFeed:
    """nats-py's ordered consumer (it resets itself on a gap; the caller checks sequences anyway)."""

    def __init__(self, js: JetStreamContext, stream: str) -> None:
        self._js = js
        self._stream = stream
        self._feed = _Feed()
        self._sub: Any = None

    async def open(self, subjects: str, from_seq: int) -> None:
        # Ordered push consumer: server-side flow control, no acks (GUIDE §6).
        self._sub = await self._js.subscribe(
            subjects,
            stream=self._stream,
            cb=self._feed.cb,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=max(1, from_seq)),
            idle_heartbeat=IDLE_HEARTBEAT_S,
            pending_msgs_limit=-1,
            pending_bytes_limit=512 * 1024 * 1024,
        )

    async def batch(self, timeout: float) -> list[Delivery]:
        msgs = await self._feed.batch(timeout)
        return [Delivery(stream_seq(m), m.subject, m.data, m.headers) for m in msgs]

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


class DirectFeed:
    """The ordered push consumer's protocol run here, on messages handed over as the connection parses
    them (see the module's docstring)."""

    def __init__(
        self,
        nc: FastHeadersClient,
        js: JetStreamContext,
        stream: str,
        *,
        limit: int = BUFFER_LIMIT,
        heartbeat_s: float = IDLE_HEARTBEAT_S,
    ) -> None:
        self._nc = nc
        self._heartbeat_s = heartbeat_s
        self._silence_s = 3 * heartbeat_s
        self._js = js
        self._stream = stream
        self._limit = limit
        self._buffer = _Buffer()
        self._sub: Subscription | None = None
        self._next_delivery = 1
        self._reset: str | None = None
        self._held: list[str] = []  # flow control answers waiting for the reader to make room
        self._tasks: set[asyncio.Task[None]] = set()
        self._clock = asyncio.get_running_loop().time
        self._heard = self._clock()  # when the server last sent anything, heartbeats included
        #: heartbeats that found the consumer stalled on flow control (a reader that answers never sees one)
        self.stalls = 0

    async def open(self, subjects: str, from_seq: int) -> None:
        self._heard = self._clock()
        self._sub = await self._nc.subscribe(self._nc.new_inbox())
        self._nc.direct[self._sub._id] = self._on_message
        config = ConsumerConfig(
            deliver_subject=self._sub.subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, from_seq),
            ack_policy=AckPolicy.NONE,
            filter_subject=subjects,
            flow_control=True,
            idle_heartbeat=self._heartbeat_s,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            await self._js.add_consumer(self._stream, config)
        except BaseException:
            await self.close()
            raise

    async def batch(self, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._buffer.items and self._reset is None:
            self._answer_held()
            silent_until = self._heard + self._silence_s
            now = loop.time()
            if now >= silent_until:
                self._lose(f"nothing heard for {self._silence_s:.0f} s, heartbeats included")
                break
            if now >= deadline:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await self._buffer.wait(min(deadline, silent_until) - now)
        out: list[Delivery] = self._buffer.take()
        if not out and self._reset is not None:
            raise FeedReset(self._reset)
        self._answer_held()
        return out

    async def close(self) -> None:
        """Stop listening: the server deletes the consumer once its inbox has no interest."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        self._nc.direct.pop(sub._id, None)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()

    def _on_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self._heard = self._clock()
        if headers and headers[: len(_STATUS)] == _STATUS:
            self._on_status(reply, headers)
            return
        if self._reset is not None:
            return  # after a loss nothing more is taken from this consumer
        found = ack_fields(reply) if reply else None
        if found is None:
            return  # not a delivery of this consumer
        seq, delivery = found.stream_seq, found.delivery_seq
        if delivery != self._next_delivery:
            self._lose(f"delivery {delivery} where {self._next_delivery} was next")
            return
        self._next_delivery = delivery + 1
        self._buffer.put(Delivery(seq, subject.decode(), data, None, headers or b"", found.stored_ns))

    def _on_status(self, reply: bytes, headers: bytes) -> None:
        if reply:  # a flow control request: answered once what came before it is buffered with room left
            self._held.append(reply.decode())
            if len(self._buffer.items) < self._limit:
                self._answer_held()
            return
        fields = message_headers(headers) or {}
        last = fields.get(_LAST_CONSUMER)
        if last is not None and int(last) >= self._next_delivery:
            self._lose(f"a heartbeat says delivery {last} was sent; {self._next_delivery - 1} came")
        stalled = fields.get(_STALLED)
        if stalled:  # the server waited for a flow control answer that never came: answer it now
            self.stalls += 1
            self._send(stalled)

    def _lose(self, why: str) -> None:
        self._reset = why
        self._buffer.wake()

    def _answer_held(self) -> None:
        held, self._held = self._held, []
        for subject in held:
            self._send(subject)

    def _send(self, subject: str) -> None:
        task = asyncio.get_running_loop().create_task(self._publish(subject))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, subject: str) -> None:
        # Lost with the connection: the follow's probe resubscribes when nothing more comes.
        with contextlib.suppress(nats.errors.Error):
            await self._nc.publish(subject, b"")
