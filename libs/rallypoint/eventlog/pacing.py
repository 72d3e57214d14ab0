"""Read pacing: a connection that only listens lets a trickle of messages gather before it reads them.

Every service follows the log, and at a steady trickle (a few thousand events a second, a few in each
socket read) what one delivery costs a follower is mostly waking up for it: the event loop's turn, the
read, the parse loop and the fold's task, once per message. ``followbench --in-flight 4`` measured
51-59 us of CPU per followed event that way against 22-25 us when each read waits 20 ms after one that
emptied the socket: the kernel keeps what arrives meanwhile and the next read takes it all at once.

A service whose reactions may come tens of milliseconds later (a standby's fold, the projector, the
predictor, ...) sets ``seconds``; one on a job's way to running (the API, the leading scheduler, the job
controller) leaves it at 0 (``runtime.config.READ_PACING_S`` lists who paces).

The pause never slows the connection's own conversations: it is skipped while a reply is awaited (an
append's acknowledgement, a KV operation, a request, a flush), a request made during one ends it
(``interrupt``), and a read that filled the buffer is followed by the next at once, so a burst is read as
fast as without pacing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator


class ReadPacing:
    """How long a connection waits after a read that emptied its socket (``seconds``; 0: not at all)."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self._waiter: asyncio.Future[None] | None = None
        #: pauses taken (a read that found the socket emptied while nothing was awaited)
        self.pauses = 0

    async def after_read(self, size: int, chunk: int, awaiting_reply: Callable[[], bool]) -> None:
        """Called by the connection's reader after each read of ``size`` bytes (at most ``chunk``)."""
        if self.seconds <= 0 or size >= chunk or awaiting_reply():
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(self.seconds, _resolve, waiter)
        self.pauses += 1
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def interrupt(self) -> None:
        """End a pause now: something on this connection waits for an answer."""
        _resolve(self._waiter)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No pacing within (a standby that now leads), the setting restored after."""
        seconds, self.seconds = self.seconds, 0.0
        self.interrupt()
        try:
            yield
        finally:
            self.seconds = seconds


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
