"""Our header parser and builder (``FastHeadersClient``) give exactly what nats-py's own give, on the headers
we write, on the server's status messages, and on many random blocks: only the cost differs."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from nats.aio.client import Client

from rallypoint.eventlog import connection
from rallypoint.eventlog.connection import CLIENT_CLASS, FastHeadersClient, header_block, parse_header_lines

NATS_PARSE = Client._parse_header_lines

# What the log's messages carry (the envelope, the message id, a trace, a fence) and what the server sends.
OURS = (
    b"ce-specversion: 1.0\r\nce-id: job-000001:s\r\nce-source: api\r\n"
    b"ce-type: io.rallypoint.JobSubmitted.v1\r\nce-time: 2026-11-25T17:00:00.123456Z\r\n"
    b"ce-subject: rally.job.job-000001\r\ncontent-type: application/json\r\nNats-Msg-Id: job-000001:s\r\n"
    b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
    b"Nats-Expected-Last-Subject-Sequence: 42\r\n"
    b"Nats-Expected-Last-Subject-Sequence-Subject: rally.sched.>\r\n\r\n"
)
FULL_MESSAGES = (
    b"NATS/1.0\r\n" + OURS,
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1016\r\nNats-Last-Stream: 1024\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0\r\n"
    b"Nats-Consumer-Stalled: $JS.FC.RALLY.abc.1\r\n\r\n",
    b"NATS/1.0 100 FlowControl Request\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\n\r\n",
    b"NATS/1.0 404 No Messages\r\n\r\n",
    b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\nNats-Pending-Bytes: 0\r\n\r\n",
    b"NATS/1.0 409 Consumer Deleted\r\n\r\n",
    b"NATS/1.0 503\r\n\r\n",
    b"NATS/1.0\r\nNats-Stream: RALLY\r\nNats-Subject: rally.job.j1\r\nNats-Sequence: 7\r\n"
    b"Nats-Time-Stamp: 2026-11-25T17:00:00.1Z\r\n\r\n",
)
SAMPLES = (
    OURS,
    b"",
    b"\r\n",
    b"a: b",
    b"a:b\r\n",
    b"a:\r\n",
    b"a: \r\n",
    b"a: b: c:d\r\n",
    b"a: b c  \r\n",
    b"a: 1\r\na: 2\r\n",
    b"a b: c\r\n",
    b" a : b\r\n",
    b"a\t: b\r\n",
    b"\x1ca: b\r\n",
    b"a\x1f: b\r\n",
    b"a: \x1cb\x1c\r\n",
    b": b\r\n",
    b"no colon\r\na: b\r\n",
    b"a: b\nc: d\r\n",
    b"a: b\rc: d\r\n",
    b"a: caf\xc3\xa9\r\n",
    b"caf\xc3\xa9: b\r\n",
    b"a: \xff\xfe\r\n",
    b"a: b\r\n\r\n\r\nc: d",
    b"a: \x7f\r\n",
)


def test_the_fast_client_is_the_one_every_connection_gets() -> None:
    assert CLIENT_CLASS is FastHeadersClient


@pytest.mark.parametrize("raw", SAMPLES)
def test_known_blocks_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert FastHeadersClient._parse_header_lines(raw) == NATS_PARSE(raw)


def test_the_blocks_we_write_take_the_fast_path() -> None:
    def refuse(raw: bytes) -> dict[str, str]:
        raise AssertionError(f"fell back on {raw!r}")

    assert parse_header_lines(OURS, refuse) == NATS_PARSE(OURS)
    assert len(NATS_PARSE(OURS)) == 11


def _random_block(rng: random.Random) -> bytes:
    """Lines mostly like ours, some broken in the ways nats-py treats specially."""
    pieces = [
        b"Nats-Msg-Id",
        b"ce-id",
        b"a",
        b":",
        b": ",
        b" ",
        b"\t",
        b"\r\n",
        b"\r",
        b"\n",
        b"\x1c",
        b"\x0b",
    ]
    pieces += [b"v", b"x:y", b"\xc3\xa9", b"\xff", b"", b"-", b"1.0", b"\x7f", b"\x00"]
    lines = []
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.5:
            lines.append(rng.choice([b"k", b"ce-type", b"X"]) + b": " + rng.choice([b"v", b"io.x.v1", b""]))
        else:
            lines.append(b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))))
    return b"\r\n".join(lines) + rng.choice([b"", b"\r\n", b"\r\n\r\n"])


def test_random_blocks_parse_as_nats_py_parses_them() -> None:
    rng = random.Random(15)
    fast = 0
    for _ in range(20000):
        raw = _random_block(rng)
        assert FastHeadersClient._parse_header_lines(raw) == NATS_PARSE(raw), raw
        fast += connection._CANONICAL_BLOCK.fullmatch(raw.decode("latin-1")) is not None
    assert fast > 2000  # both paths were compared


async def _read_headers(client: Client, raw: bytes) -> object:
    """What nats-py's message path gets for ``raw``: the headers, or the error raised (nats-py raises on
    some malformed status lines; ours must raise the same)."""
    try:
        return await client._process_headers(raw)
    except Exception as exc:
        return type(exc), str(exc)


def _process_headers(client: Client, raw: bytes) -> object:
    return asyncio.run(_read_headers(client, raw))


@pytest.mark.parametrize("raw", FULL_MESSAGES + tuple(b"NATS/1.0\r\n" + s for s in SAMPLES if s))
def test_whole_messages_status_lines_included_read_as_nats_py_reads_them(raw: bytes) -> None:
    assert _process_headers(FastHeadersClient(), raw) == _process_headers(Client(), raw)


async def test_random_whole_messages_read_as_nats_py_reads_them() -> None:
    """Awaited on the test's loop, one client of each kind for all of them (reading headers keeps no
    state): an ``asyncio.run`` and two new clients per message cost ten times the parsing."""
    rng = random.Random(15)
    fast, plain = FastHeadersClient(), Client()
    firsts = [
        b"\r\n",
        b" 100 Idle Heartbeat\r\n",
        b" 404 No Messages\r\n",
        b" 503",
        b" ",
        b"",
        b"\r",
        b"x\r\n",
    ]
    for _ in range(5000):
        raw = b"NATS/1.0" + rng.choice(firsts) + _random_block(rng)
        assert await _read_headers(fast, raw) == await _read_headers(plain, raw), raw


class _NoFallback(FastHeadersClient):
    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        raise AssertionError(f"nats-py's path parsed {raw!r}")


def test_our_messages_take_the_fast_path_whole() -> None:
    raw = b"NATS/1.0\r\n" + OURS
    assert _process_headers(_NoFallback(), raw) == _process_headers(Client(), raw)


class _Recording:
    """Keeps the commands a client would send instead of sending them (the bytes under comparison)."""

    def __init__(self) -> None:
        super().__init__()  # the client's own state, unconnected: no flush queue, nothing written
        self.sent: list[bytes] = []

    async def _send_command(self, cmd: bytes, priority: bool = False) -> None:
        self.sent.append(cmd)


class _NatsRecording(_Recording, Client):
    pass


class _FastRecording(_Recording, FastHeadersClient):
    pass


async def _publish(
    client: _NatsRecording | _FastRecording, headers: dict[str, Any]
) -> tuple[object, dict[str, int]]:
    """What publishing ``headers`` sends and counts, as a new client would: only what this call adds."""
    sent, counted = len(client.sent), {k: client.stats[k] for k in ("out_msgs", "out_bytes")}
    try:
        await client._send_publish("rally.job.j1", "_INBOX.x", b"{}", 2, headers)
    except Exception as exc:  # nats-py refuses some headers: ours must refuse the same ones the same way
        return (type(exc), str(exc)), {}
    return client.sent[sent:], {k: client.stats[k] - v for k, v in counted.items()}


def _published(
    cls: type[_NatsRecording | _FastRecording], headers: dict[str, Any]
) -> tuple[object, dict[str, int]]:
    return asyncio.run(_publish(cls(), headers))


HEADER_CASES: tuple[dict[str, Any], ...] = (
    {"ce-specversion": "1.0", "ce-id": "j1:s", "ce-time": "2026-11-25T17:00:00Z", "Nats-Msg-Id": "j1:s"},
    {"a": ""},
    {"a": " padded "},
    {"a": "two words"},
    {" a ": "b"},
    {"": "b", "c": "d"},
    {"a b": "c"},
    {"a:b": "c"},
    {"\r\nb": "v"},
    {"b": "v\r\n"},
    {"b": "v\r\n\r\n", "c": "d"},
    {"b": "line\nbreak"},
    {"b": "caf\u00e9"},
    {"b": "\u00a0nbsp\u00a0"},
    {"b": "\x1cv"},
    {"b": 1},
    {"b": "v", "a": "w"},
)


@pytest.mark.parametrize("headers", HEADER_CASES)
def test_published_bytes_are_nats_py_bytes(headers: dict[str, Any]) -> None:
    assert _published(_FastRecording, headers) == _published(_NatsRecording, headers)


def test_our_headers_take_the_fast_path_when_published() -> None:
    headers = NATS_PARSE(OURS)
    block = header_block(headers)
    assert block is not None and block == b"NATS/1.0\r\n" + OURS
    sent, stats = _published(_FastRecording, headers)
    assert isinstance(sent, list) and len(sent) == 1 and sent[0].startswith(b"HPUB rally.job.j1 _INBOX.x ")
    assert stats == {"out_msgs": 1, "out_bytes": 2}
    assert (sent, stats) == _published(_NatsRecording, headers)


def _random_text(rng: random.Random, canonical: list[str], tricky: list[str]) -> str:
    if rng.random() < 0.7:
        return rng.choice(canonical)
    return "".join(rng.choice(tricky + canonical) for _ in range(rng.randint(0, 4)))


async def test_random_headers_publish_as_nats_py_publishes_them() -> None:
    """Awaited on the test's loop, one client of each kind for all of them (``_publish`` takes what each
    call adds): an ``asyncio.run`` and two new clients per publish cost more than the publishing."""
    rng = random.Random(15)
    fast_client, nats_client = _FastRecording(), _NatsRecording()
    names, values = ["a", "ce-id", "Nats-Msg-Id", "X"], ["", "1.0", "j1:s", "rally.sched.>", "a=b;c"]
    tricky = [" ", ":", "\r", "\n", "\t", "\u00e9", "\x1c", "\x7f", ""]
    sent = fast = 0
    for _ in range(5000):
        headers = {
            _random_text(rng, names, tricky): _random_text(rng, values, tricky)
            for _ in range(rng.randint(1, 4))
        }
        published = await _publish(fast_client, headers)
        assert published == await _publish(nats_client, headers), headers
        sent += isinstance(published[0], list)
        fast += header_block(headers) is not None
    assert sent > 1000 and fast > 1000  # both paths were compared, on headers nats-py accepts


def test_a_nats_py_without_the_private_parser_gets_the_plain_client(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connection._nats_internals_present()
    monkeypatch.delattr(Client, "_parse_header_lines")
    monkeypatch.setattr(connection, "_NATS_PARSE", None)
    assert not connection._nats_internals_present()
