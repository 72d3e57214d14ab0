"""Where the log ends, asked of the stream's leader, for reads that must see every acknowledged write.

Several API replicas serve the same clients: a job accepted by one must not be a 404 on another a moment
later. A replica's fold only says what it has received, never that nothing newer was acknowledged, so
before answering a read learns the stream's last sequence from the server (as etcd's ReadIndex asks its
leader for the commit index) and waits until its fold holds that much. Any write acknowledged before the
read began is at or below that sequence: the acknowledgement and the stream info both come from the
stream's leader, and the question is sent only after the read began.

Concurrent readers share one question (``ReadIndex``), so N reads in flight cost one round trip, not N.
A reader never joins a question that was already sent when it arrived: the server may have answered it
before a write the reader's client has since seen acknowledged. It waits for the next one instead,
which goes out as soon as the one on the wire is answered, for every reader that came meanwhile (at
most one question in flight: at most two round trips per read, however many reads come).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors

from rallypoint.eventlog import EventLog, LogUnavailable

#: The JetStream API prefix of ``EventLog``'s context (nats-py's default; NATS permissions grant it).
JS_API = "$JS.API"

Fetch = Callable[[], Awaitable[int]]


class _StreamState(msgspec.Struct):
    last_seq: int = 0


class _ApiError(msgspec.Struct):
    code: int = 0
    description: str = ""


class _StreamInfo(msgspec.Struct):
    """The one field a read needs of the server's stream info answer (decoding the rest costs CPU)."""

    state: _StreamState | None = None
    error: _ApiError | None = None


_decode_info = msgspec.json.Decoder(_StreamInfo).decode


def stream_tip(log: EventLog, timeout: float) -> Fetch:
    """A function that asks the server for ``log``'s last stream sequence (LogUnavailable if it cannot)."""
    subject = f"{JS_API}.STREAM.INFO.{log.stream}"

    async def fetch() -> int:
        if not log.nc.is_connected:
            # Fail now rather than after the timeout: a request made while reconnecting waits it out.
            raise LogUnavailable("not connected to NATS")
        try:
            reply = await log.nc.request(subject, b"", timeout=timeout)
        except (nats.errors.Error, TimeoutError) as exc:
            raise LogUnavailable(f"stream {log.stream} info got no answer ({type(exc).__name__})") from exc
        info = _decode_info(reply.data)
        if info.error is not None or info.state is None:
            error = info.error or _ApiError()
            raise LogUnavailable(f"stream {log.stream} info refused: {error.code} {error.description}")
        return info.state.last_seq

    return fetch


class ReadIndex:
    """The log's last sequence as of a moment after ``latest`` was called; concurrent callers share."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        # One future per reader waiting for the next question (a reader that gives up cancels only its
        # own); None while nobody waits.
        self._gathering: list[asyncio.Future[int]] | None = None
        self._busy = False  # a question is out (or about to go): the gathering readers wait for it
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: a bare task may be collected
        self.asked = 0  # questions sent; with ``reads``, how well readers coalesce (``/metrics``)
        self.reads = 0

    async def latest(self, timeout: float) -> int:
        """The stream's last sequence, from a question sent after this call; LogUnavailable if no answer
        came within ``timeout``."""
        self.reads += 1
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._gathering is None:
            self._gathering = []
            if not self._busy:
                self._start()
        self._gathering.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError as exc:
            raise LogUnavailable(f"the log's last sequence did not come within {timeout:.1f}s") from exc

    async def close(self) -> None:
        """Cancel the question on the wire and the readers waiting (they get CancelledError)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _answer(self._gathering, None)
        self._gathering, self._busy = None, False

    def _start(self) -> None:
        self._busy = True
        self.asked += 1
        task = asyncio.create_task(self._round(), name="api-read-index")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round(self) -> None:
        # The readers gathered until now came before the question is sent: this answer is theirs. Any
        # reader from here on gathers for the next question.
        readers, self._gathering = self._gathering, None
        try:
            _answer(readers, await self._fetch())
        except asyncio.CancelledError:
            _answer(readers, None)  # shutting down (``close``)
            raise
        except Exception as exc:
            _answer(readers, exc)
        # No await from here on: the next question goes out at once for whoever gathered meanwhile.
        self._busy = False
        if self._gathering is not None:
            self._start()


def _answer(readers: list[asyncio.Future[int]] | None, answer: int | Exception | None) -> None:
    """The tip to every reader still waiting, or the failure (None: cancelled)."""
    for reader in readers or ():
        if reader.done():  # gave up (its timeout, or its request's cancellation)
            continue
        if answer is None:
            reader.cancel()
        elif isinstance(answer, Exception):
            reader.set_exception(answer)
        else:
            reader.set_result(answer)
