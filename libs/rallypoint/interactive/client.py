"""The user's end of a terminal session: the local terminal in raw mode, relayed over the API's WebSocket.

``relay`` connects to ``GET /v1/jobs/{id}/terminal`` with the user's token, puts the local terminal in raw
mode (every key, Ctrl-C included, goes to the rank; the rank's terminal echoes), sends the window size at
once and on every SIGWINCH, and copies frames both ways until the rank exits or the session is closed.
The local terminal is restored however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp

from rallypoint.interactive import frames


@dataclass(frozen=True)
class Ending:
    """How a session ended: the rank's exit ``status``, or why it was closed (``reason``), or the
    connection lost (``lost``: the rank may still run, and ``rally attach`` reaches it again)."""

    status: int | None = None
    reason: str = ""
    lost: bool = False


class HandshakeRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


def terminal_url(api_url: str, job_id: str, rank: int) -> str:
    base = api_url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    return f"{base}/v1/jobs/{urllib.parse.quote(job_id, safe='')}/terminal?rank={rank}"


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal on ``fd`` in raw mode for the block (nothing when it is no terminal), then as it was."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def window_of(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


async def relay(api_url: str, token: str | None, job_id: str, rank: int = 0, *, stdin: int = 0,
                stdout: int = 1) -> Ending:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(terminal_url(api_url, job_id, rank), headers=headers, heartbeat=30.0)
        except aiohttp.WSServerHandshakeError as exc:
            raise HandshakeRefused(exc.status, exc.message) from None
        async with ws:
            with raw_mode(stdin):
                return await _pump(ws, stdin, stdout)


async def _pump(ws: aiohttp.ClientWebSocketResponse, stdin: int, stdout: int) -> Ending:
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue()  # frames, in the order typed

    def on_keys() -> None:
        try:
            chunk = os.read(stdin, 65536)
        except OSError:
            chunk = b""
        if not chunk:  # end of input: stop reading, the session goes on until the rank exits
            loop.remove_reader(stdin)
            return
        keys.put_nowait(frames.data(chunk))

    def on_resize() -> None:
        keys.put_nowait(frames.resize(*window_of(stdout)))

    loop.add_reader(stdin, on_keys)
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGWINCH, on_resize)
    sender = asyncio.create_task(_send(ws, keys))
    try:
        await ws.send_bytes(frames.resize(*window_of(stdout)))
        return await _receive(ws, stdout)
    finally:
        loop.remove_reader(stdin)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGWINCH)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender


async def _send(ws: aiohttp.ClientWebSocketResponse, keys: asyncio.Queue[bytes]) -> None:
    while True:
        await ws.send_bytes(await keys.get())


async def _receive(ws: aiohttp.ClientWebSocketResponse, stdout: int) -> Ending:
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.BINARY:
            continue
        try:
            frame = frames.decode(msg.data)
        except frames.FrameError:
            continue
        if frame.kind == frames.DATA:
            _write_all(stdout, frame.payload)
        elif frame.kind == frames.EXIT:
            return Ending(status=frames.status(frame))
        elif frame.kind == frames.CLOSED:
            return Ending(reason=frames.reason(frame))
    return Ending(lost=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


def run(api_url: str, token: str | None, job_id: str, rank: int = 0) -> Ending:
    """``relay`` on this process's terminal (standard input and output)."""
    return asyncio.run(
        relay(api_url, token, job_id, rank, stdin=sys.stdin.fileno(), stdout=sys.stdout.fileno())
    )
