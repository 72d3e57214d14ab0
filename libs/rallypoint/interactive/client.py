"""The user's end of a terminal session: the local terminal in raw mode, relayed over the API's WebSocket.

``relay`` connects to ``GET /v1/jobs/{id}/terminal`` with the user's token, puts the local terminal in raw
mode (every key, Ctrl-C included, goes to the rank; the rank's terminal echoes), sends the window size at
once and on every SIGWINCH, and copies frames both ways until the rank exits or the session is closed.
The local terminal is restored however it ends.

``forward`` is ``kubectl port-forward`` for a port the job publishes: it listens on a local port and, for
each connection to it, opens ``GET /v1/jobs/{id}/ports/{port}`` and copies the bytes both ways. ``rally run
--port 8888 --pty`` does the same for the session's length.
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
from collections.abc import Iterator, Sequence
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


def terminal_url(api_url: str, job_id: str, rank: int, port: int | None = None) -> str:
    """The WebSocket URL of a job's terminal, or of a connection to one of its ports (``port``)."""
    base = api_url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    what = "terminal" if port is None else f"ports/{port}"
    return f"{base}/v1/jobs/{urllib.parse.quote(job_id, safe='')}/{what}?rank={rank}"


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
                stdout: int = 1, ports: Sequence[int] = ()) -> Ending:  # fmt: skip
    """The terminal session; meanwhile each of ``ports`` is forwarded from the same local port."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(terminal_url(api_url, job_id, rank), headers=headers, heartbeat=30.0)
        except aiohttp.WSServerHandshakeError as exc:
            raise HandshakeRefused(exc.status, exc.message) from None
        servers = []
        for port in ports:
            try:
                servers.append(await _listen(http, api_url, headers, job_id, rank, port, port))
                print(f"rally: localhost:{port} reaches the job's port {port}", file=sys.stderr)
            except OSError as exc:  # the local port is taken: the session goes on without it
                print(f"rally: cannot forward port {port}: {exc}", file=sys.stderr)
        try:
            async with ws:
                with raw_mode(stdin):
                    return await _pump(ws, stdin, stdout)
        finally:
            for server in servers:
                server.close()


async def forward(api_url: str, token: str | None, job_id: str, port: int, local_port: int, rank: int = 0,
                  *, ready: asyncio.Event | None = None) -> None:  # fmt: skip
    """Forward ``local_port`` on this machine's loopback to the job's ``port`` until cancelled."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        server = await _listen(http, api_url, headers, job_id, rank, port, local_port)
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()


async def _listen(http: aiohttp.ClientSession, api_url: str, headers: dict[str, str], job_id: str, rank: int,
                  port: int, local_port: int) -> asyncio.Server:  # fmt: skip
    url = terminal_url(api_url, job_id, rank, port)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with http.ws_connect(url, headers=headers, heartbeat=30.0) as ws:
                await _tunnel(ws, reader, writer)
        except aiohttp.ClientError as exc:
            print(f"\r\nrally: port {port}: {exc}\r", file=sys.stderr)
        finally:
            writer.close()

    return await asyncio.start_server(connection, "127.0.0.1", local_port)


async def _tunnel(ws: aiohttp.ClientWebSocketResponse, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:  # fmt: skip
    """Bytes of one local connection both ways, until either side closes."""

    async def upstream() -> None:
        while chunk := await reader.read(65536):
            await ws.send_bytes(frames.data(chunk))

    async def downstream() -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                continue
            frame = frames.decode(msg.data)
            if frame.kind != frames.DATA:
                return  # closed: the port's end hung up, or the job ended
            writer.write(frame.payload)
            await writer.drain()

    tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


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


def run(api_url: str, token: str | None, job_id: str, rank: int = 0, ports: Sequence[int] = ()) -> Ending:
    """``relay`` on this process's terminal (standard input and output)."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    return asyncio.run(relay(api_url, token, job_id, rank, stdin=stdin, stdout=stdout, ports=ports))
