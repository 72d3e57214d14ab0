"""The node agent's side of interactive sessions: relay a rank's terminal between its wrapper and NATS.

The rank wrapper holds the pty and serves it on a Unix socket in the attempt folder (``ptyhost``). The
API asks ``cmd.agent.<node>.tty`` to ``open`` a session for one rank; from then on this relay

- reads the wrapper's frames (output, the rank's exit, a takeover) and publishes each as one message on
  ``tty.<node>.<session>``, the subject only this node's agent may publish on;
- takes the API's frames from ``cmd.agent.<node>.tty.<session>`` (keystrokes, window sizes, keepalives,
  a detach) and writes keystrokes and sizes to the wrapper.

One session per terminal: a new ``open`` for a rank closes the session attached to it (as the wrapper
would: it serves one client). A ``forward`` session is one TCP connection to a port the job publishes, on
the node's loopback, once its listener is found to be the rank's own (``ports``): raw bytes both ways in
``DATA`` frames, as many sessions as connections.

A session whose API stops sending keepalives (the API process died with its WebSocket) is closed after
``KEEPALIVE_TIMEOUT_S``, so ``info`` answers "detached" and the API that watches the disconnect grace may
end the job. Should that API go too, nobody would: so a terminal left without a session for its team's
grace (``TerminalRequest.grace_s``) and ``HANGUP_MARGIN_S`` more (the API's cancel goes first) is hung
up here, as a terminal whose line dropped: SIGHUP to the rank's group, and a line in its log saying why.
The rank never sees any of this: it holds no credential, and its terminal outlives every
session (``rally attach``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rallypoint.agent.launcher import RankLauncher
from rallypoint.agent.ports import PortRefused, loopback_target
from rallypoint.agent.ptyhost import short_path
from rallypoint.events import subjects
from rallypoint.interactive import frames
from rallypoint.protocol import TerminalReply, TerminalRequest

_log = logging.getLogger(__name__)

#: The API sends a keepalive every few seconds while its client is connected; this long without one,
#: the session is treated as gone.
KEEPALIVE_TIMEOUT_S = 20.0
#: How long after the API should have ended a detached session the agent hangs its terminal up itself.
HANGUP_MARGIN_S = 30.0
_RankKey = tuple[str, int, int]


@dataclass
class _Session:
    session: str
    key: _RankKey
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    last_ping: float
    sub: Subscription | None = None
    pump: asyncio.Task[None] | None = None
    closed: bool = False
    exited: bool = field(default=False)
    #: a terminal's stream carries frames (``encode_stream``); a forwarded port's, the raw bytes
    framed: bool = True
    #: the team's disconnect grace (0: none given): how long the terminal may stay detached
    grace_s: float = 0.0


class TerminalRelay:
    def __init__(
        self,
        nc: NATS,
        node_id: str,
        launcher: RankLauncher,
        *,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.node_id = node_id
        self.launcher = launcher
        self.keepalive_timeout_s = keepalive_timeout_s
        self._clock = clock
        self._by_key: dict[_RankKey, _Session] = {}  # terminals, one session each
        self._forwards: dict[str, _Session] = {}  # forwarded connections, by session
        self._hangups: dict[_RankKey, asyncio.Task[None]] = {}  # detached terminals' deadlines
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name=f"agent-{self.node_id}-terminals")

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        for session in [*self._by_key.values(), *self._forwards.values()]:
            await self._end(session, "the node agent is stopping")
        for hangup in self._hangups.values():
            hangup.cancel()

    def attached(self, job_id: str, attempt: int, rank: int) -> bool:
        return (job_id, attempt, rank) in self._by_key

    async def handle(self, request: TerminalRequest) -> TerminalReply:
        if request.op == "info":
            return TerminalReply(
                ok=True, attached=self.attached(request.job_id, request.attempt, request.rank)
            )
        if not subjects.TOKEN_PATTERN.match(request.session):
            return TerminalReply(ok=False, error=f"not a valid session id: {request.session!r}")
        if request.op == "forward":
            return await self.forward(request)
        return await self.open(request)

    async def forward(self, request: TerminalRequest) -> TerminalReply:
        key = (request.job_id, request.attempt, request.rank)
        try:
            published = await asyncio.to_thread(self.launcher.published, *key)
            for _ in range(20):  # a rank that just started has no pid on record for a moment
                if published is not None:
                    break
                await asyncio.sleep(0.1)
                published = await asyncio.to_thread(self.launcher.published, *key)
        except ValueError as exc:
            return TerminalReply(ok=False, error=str(exc))
        if published is None:
            error = f"no rank {request.rank} of {request.job_id} attempt {request.attempt} runs here"
            return TerminalReply(ok=False, error=error)
        ports, pid = published
        if request.port not in ports:
            return TerminalReply(ok=False, error=f"{request.job_id} does not publish port {request.port}")
        try:
            uid = (await asyncio.to_thread(os.stat, f"/proc/{pid}")).st_uid
            host = await asyncio.to_thread(loopback_target, request.port, uid)
            reader, writer = await asyncio.open_connection(host, request.port)
        except (PortRefused, OSError) as exc:
            return TerminalReply(ok=False, error=str(exc))
        session = _Session(request.session, key, reader, writer, last_ping=self._clock(), framed=False)
        self._forwards[request.session] = session
        await self._relay(session)
        return TerminalReply(ok=True)

    async def open(self, request: TerminalRequest) -> TerminalReply:
        key = (request.job_id, request.attempt, request.rank)
        try:
            path = await asyncio.to_thread(self.launcher.terminal_path, *key)
        except ValueError as exc:  # a job id that is no folder name
            return TerminalReply(ok=False, error=str(exc))
        if path is None:
            error = (
                f"no interactive rank {request.rank} of {request.job_id} attempt {request.attempt} runs here"
            )
            return TerminalReply(ok=False, error=error)
        previous = self._by_key.get(key)
        if previous is not None:
            await self._end(previous, "the terminal was attached elsewhere")
        try:
            reader, writer = await _connect(path)
        except OSError as exc:
            return TerminalReply(ok=False, error=f"cannot reach the terminal: {exc}")
        session = _Session(
            request.session, key, reader, writer, last_ping=self._clock(), grace_s=request.grace_s
        )
        self._by_key[key] = session
        if (hangup := self._hangups.pop(key, None)) is not None:
            hangup.cancel()
        await self._relay(session)
        _log.info("terminal of %s attempt %d rank %d opened for session %s", *key, request.session)
        return TerminalReply(ok=True, attached=previous is not None)

    async def _relay(self, session: _Session) -> None:
        session.sub = await self.nc.subscribe(
            subjects.terminal_input(self.node_id, session.session), cb=self._input(session)
        )
        session.pump = asyncio.create_task(self._pump(session), name=f"tty-{session.session}")

    def _input(self, session: _Session) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            try:
                frame = frames.decode(msg.data)
            except frames.FrameError as exc:
                _log.warning("session %s: dropped a bad frame (%s)", session.session, exc)
                return
            session.last_ping = self._clock()
            if frame.kind in (frames.DATA, frames.RESIZE) and (session.framed or frame.kind == frames.DATA):
                # a terminal's wrapper reads frames; a forwarded port, the bytes as they came
                data = frames.encode_stream(frame.kind + frame.payload) if session.framed else frame.payload
                session.writer.write(data)
                with contextlib.suppress(ConnectionError):
                    await session.writer.drain()
            elif frame.kind == frames.CLOSED:  # the client left: detach, the rank runs on
                await self._end(session, None, detached=True)

        return on_message

    async def _pump(self, session: _Session) -> None:
        """The wrapper's frames, one NATS message each, until it closes the connection."""
        decoder = frames.StreamDecoder()
        subject = subjects.terminal_output(self.node_id, session.session)
        try:
            while not session.exited and (chunk := await session.reader.read(65536)):
                if not session.framed:
                    await self.nc.publish(subject, frames.data(chunk))
                    continue
                for frame in decoder.feed(chunk):
                    await self.nc.publish(subject, frame.kind + frame.payload)
                    if frame.kind == frames.EXIT:  # the rank is gone: the session ends with it
                        session.exited = True
                        break
        except (ConnectionError, frames.FrameError) as exc:
            _log.warning("session %s: the terminal connection failed (%s)", session.session, exc)
        if not session.closed and not session.exited:
            gone = "the terminal went away" if session.framed else "the port closed the connection"
            with contextlib.suppress(Exception):
                await self.nc.publish(subject, frames.closed(gone))
        await self._end(session, None)

    async def _end(self, session: _Session, reason: str | None, *, detached: bool = False) -> None:
        """Close one session; ``reason``: tell its client why (None: it knows, or it asked). ``detached``:
        its client is gone and its terminal left alone (the grace's deadline starts)."""
        if session.closed:
            return
        session.closed = True
        if detached and session.framed and session.grace_s > 0 and session.key not in self._hangups:
            self._hangups[session.key] = asyncio.create_task(self._hang_up_later(session))
        if self._by_key.get(session.key) is session:
            del self._by_key[session.key]
        self._forwards.pop(session.session, None)
        if reason is not None:
            with contextlib.suppress(Exception):
                await self.nc.publish(
                    subjects.terminal_output(self.node_id, session.session), frames.closed(reason)
                )
        if session.sub is not None:
            with contextlib.suppress(Exception):
                await session.sub.unsubscribe()
        session.writer.close()
        with contextlib.suppress(Exception):
            await session.writer.wait_closed()
        if session.pump is not None and session.pump is not asyncio.current_task():
            session.pump.cancel()
        _log.info("session %s detached%s", session.session, f": {reason}" if reason else "")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.keepalive_timeout_s / 2))
            now = self._clock()
            for session in [*self._by_key.values(), *self._forwards.values()]:
                if now - session.last_ping > self.keepalive_timeout_s:
                    await self._end(session, "no keepalive from the API", detached=True)

    async def _hang_up_later(self, session: _Session) -> None:
        """Hang the terminal up unless a session attached to it by the deadline."""
        wait_s = session.grace_s + HANGUP_MARGIN_S
        try:
            await asyncio.sleep(wait_s)
        finally:
            if self._hangups.get(session.key) is asyncio.current_task():
                del self._hangups[session.key]
        if session.key in self._by_key:
            return
        note = f"the terminal was left without a session for {wait_s:g} s; hanging up"
        if await asyncio.to_thread(self.launcher.hang_up, *session.key, note):
            _log.warning("%s attempt %d rank %d: %s", *session.key, note)


async def _connect(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    short, fd = short_path(path.parent, path.name)
    try:
        return await asyncio.open_unix_connection(short)
    finally:
        os.close(fd)
