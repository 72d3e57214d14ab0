"""Requests on one reply subscription, their replies taken as the connection parses them.

Every append is a request (the stream's acknowledgement is its reply), and so is each launch the job
controller sends a node agent: two or three per job, in the API, the job controller and the scheduler.
nats-py 2.16 gives each request a NUID token plus two bytes from ``os.urandom`` (a ``getrandom`` system
call), waits with ``asyncio.wait_for`` (a second future, a callback and a timer) and hands the reply to
its future through a ``Msg`` queued for the subscription's task, which then awaits a callback. Here a
request's token is the connection's own count (unique under the connection's random reply prefix), it
waits on its future with one timer, and a reply without headers (every acknowledgement) completes that
future as it is parsed (``FastHeadersClient.direct``). A reply with headers (a "no responders" status)
takes nats-py's header parser, as before. What a caller gets, and what it raises, is unchanged.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

#: Takes a reply as the connection parses it: subject, reply, payload and the raw header block.
_Handler = Callable[[bytes, bytes, bytes, "bytes | None"], None]
#: Subscribes a subject with such a handler (``FastHeadersClient.subscribe_raw``).
_SubscribeRaw = Callable[[str, _Handler], Awaitable[Subscription]]

#: nats-py's private members this relies on, checked before the fast client is chosen (``connection``).
REQUIRED = ("_resp_map", "_resp_sub_prefix", "_inbox_prefix", "_nuid", "_build_message", "_process_headers")


def reply_mux_internals_present(probe: Client) -> bool:
    """Whether this nats-py keeps requests as this module expects (else nats-py's own path is used)."""
    request = getattr(Client, "_request_new_style", None)
    if request is None or list(inspect.signature(request).parameters) != [
        "self", "subject", "payload", "timeout", "headers"
    ]:  # fmt: skip
        return False
    return all(hasattr(probe, name) for name in REQUIRED) and isinstance(probe._resp_map, dict)


class ReplyMux:
    """The request path of ``FastHeadersClient`` (see the module docstring)."""

    def __init__(self, client: Client, subscribe_raw: _SubscribeRaw) -> None:
        self.client = client
        self._subscribe_raw = subscribe_raw
        self._count = 0
        self._prefix = ""
        self._sid = 0

    async def open(self) -> None:
        """Subscribe to ``<inbox prefix>.<random>.*`` once per connection, as nats-py does."""
        client = self.client
        client._resp_map = {}
        prefix = client._inbox_prefix[:]
        prefix.extend(b".")
        prefix.extend(client._nuid.next())
        prefix.extend(b".")
        client._resp_sub_prefix = prefix
        self._prefix = prefix.decode()
        self._sid = (await self._subscribe_raw(self._prefix + "*", self._take))._id

    async def request(
        self, subject: str, payload: bytes, timeout: float, headers: dict[str, Any] | None
    ) -> Msg:
        client = self.client
        if client.is_draining_pubs:
            raise nats_errors.ConnectionDrainingError
        if not client._resp_sub_prefix:
            await self.open()
        self._count += 1
        token = format(self._count, "x")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        client._resp_map[token] = future
        timer = loop.call_later(timeout, _time_out, future)
        try:
            await client.publish(subject, payload, reply=self._prefix + token, headers=headers)
            return await future
        finally:
            timer.cancel()
            client._resp_map.pop(token, None)
            if not future.done():
                future.cancel()

    def _take(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A reply, as the connection parses it: its request's future completes now (or, with headers,
        once nats-py has parsed them)."""
        future = self.client._resp_map.get(subject[len(self._prefix) :].decode())
        if future is None or future.done():
            return  # a reply after its request gave up
        if not headers:
            future.set_result(self.client._build_message(self._sid, subject, reply, data, None))
            return
        task = asyncio.ensure_future(self._with_headers(future, subject, reply, data, headers))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    async def _with_headers(
        self, future: asyncio.Future[Msg], subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        parsed = await self.client._process_headers(headers)
        if not future.done():
            future.set_result(self.client._build_message(self._sid, subject, reply, data, parsed))


#: Header parses in flight (a task must be referenced until it ends).
_pending: set[asyncio.Task[None]] = set()


def _time_out(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(nats_errors.TimeoutError())
