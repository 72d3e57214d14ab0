"""The scale bench's HTTP load generator: ``POST /v1/jobs`` over kept-alive HTTP/1.1 connections, lean.

``loadgen.submit_http`` (aiohttp's client) spends as much CPU per request as the API spends answering
it (0.3-0.4 ms each, measured on the bench machine), and in ``rally bench cluster`` it runs on the
same cores as the API, so it took half the machine from what it measures. The raw JetStream reference
beside it is a lean client (one nats-py request per publish). This one writes each request as
prepared bytes on one of ``concurrency`` connections and reads the answer by its Content-Length: the
same requests reach the API (real HTTP/1.1 over TCP, bearer token, Idempotency-Key, a JSON body), and a
submission still counts only when the API answered 202 with its job id.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any

import msgspec

from rallypoint.localcluster.http import auth_headers

from .loadgen import Submitted

_json = msgspec.json.Encoder()
_HEAD_END = b"\r\n\r\n"


class _Answer(msgspec.Struct):
    job_id: str = ""


class HttpAnswerError(Exception):
    """An answer this client cannot read (no Content-Length, or a malformed status line)."""


def _request_head(host: str, headers: dict[str, str], key: str, length: int) -> bytes:
    lines = ["POST /v1/jobs HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Idempotency-Key: {key}", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, content length, whether the server closes the connection after this answer)."""
    status_line, _, rest = head.partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise HttpAnswerError(f"not an HTTP/1.x status line: {status_line!r}")
    length: int | None = None
    close = False
    for line in rest.split(b"\r\n"):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    if length is None:
        raise HttpAnswerError("the answer has no Content-Length")
    return int(parts[1]), length, close


class _Connection:
    """One kept-alive connection; reopened when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        try:
            self.writer.write(request)
            head = await self.reader.readuntil(_HEAD_END)
            status, length, close = _parse_head(head[: -len(_HEAD_END)])
            body = await self.reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def submit_lean(
    api_url: str,
    count: int,
    *,
    concurrency: int,
    body: dict[str, Any],
    prefix: str,
    time_limit_s: float,
    token: str | None = None,
) -> tuple[list[Submitted], float, int]:
    """(accepted submissions, seconds taken, refused or failed), as ``loadgen.submit_http`` answers."""
    url = urllib.parse.urlsplit(api_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    payload = _json.encode(body)
    headers = auth_headers(api_url, token)
    accepted: list[Submitted] = []
    failed = 0
    deadline = time.monotonic() + time_limit_s
    numbers = iter(range(count))

    async def worker() -> None:
        nonlocal failed
        connection = _Connection(host, port)
        try:
            for i in numbers:
                if time.monotonic() >= deadline:
                    return
                request = _request_head(url.netloc, headers, f"{prefix}-{i}", len(payload)) + payload
                sent, t0 = time.time(), time.perf_counter()
                try:
                    status, answer = await connection.exchange(request)
                except (OSError, asyncio.IncompleteReadError, HttpAnswerError, ValueError):
                    failed += 1
                    continue
                if status == 202:
                    job_id = msgspec.json.decode(answer, type=_Answer).job_id
                    accepted.append(Submitted(job_id, sent, time.perf_counter() - t0))
                else:
                    failed += 1
        finally:
            connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return accepted, time.perf_counter() - start, failed
