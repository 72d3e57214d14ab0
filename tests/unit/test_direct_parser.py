"""``DirectParser`` hands over exactly what nats-py's parser does, in the same order, however the bytes are
cut into reads: messages with and without headers or a reply, payloads holding CRLF, pings, pongs, +OK,
-ERR, INFO and control lines spaced unusually (nats-py's own parser takes those), each message going to
its subscription's direct function or to ``_process_msg``."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any

import pytest
from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

from rallypoint.eventlog.pacing import ReadPacing
from rallypoint.eventlog.wire import DirectParser, parser_internals_present

DIRECT_SIDS = (1, 3)


class Recorder:
    """What a connection sees from its parser, in order (the methods nats-py's parser calls)."""

    def __init__(self, direct: bool) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.sids: list[int] = []  # of the messages that reached _process_msg
        self.stats: Counter[str] = Counter()
        self.direct = {sid: self._direct_handler for sid in DIRECT_SIDS} if direct else {}
        self.pacing = ReadPacing()  # 0 s: the parser reads on at once

    def awaiting_reply(self) -> bool:
        return False

    def _direct_handler(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.seen.append(("msg", subject, reply, data, headers))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
        self.sids.append(sid)
        self.seen.append(("msg", subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.seen.append(("ping",))

    async def _process_pong(self) -> None:
        self.seen.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.seen.append(("info", info))

    async def _process_err(self, err: str) -> None:
        self.seen.append(("err", err))


def _message(rng: random.Random) -> bytes:
    sid = rng.choice((1, 2, 3, 4))
    subject = rng.choice((b"_INBOX.abc", b"rally.job.j1", b"x"))
    reply = rng.choice((b"", b"$JS.ACK.RALLY.c.1.%d.%d.1700000000000000000.0" % (sid, sid)))
    payload = bytes(rng.choice(b"ab{}:\r\n ") for _ in range(rng.randrange(0, 120)))
    reply_part = b" " + reply if reply else b""
    if rng.random() < 0.7:
        lines = b"".join(b"K%d: v%d\r\n" % (i, rng.randrange(99)) for i in range(rng.randrange(0, 4)))
        headers = b"NATS/1.0\r\n" + lines + b"\r\n"
        head = b"HMSG %s %d%s %d %d\r\n" % (
            subject,
            sid,
            reply_part,
            len(headers),
            len(headers) + len(payload),
        )
        return head + headers + payload + b"\r\n"
    return b"MSG %s %d%s %d\r\n" % (subject, sid, reply_part, len(payload)) + payload + b"\r\n"


OTHERS = (
    b"PING\r\n",
    b"PONG\r\n",
    b"+OK\r\n",
    b"-ERR 'Stale Connection'\r\n",
    b"INFO " + json.dumps({"server_id": "s", "max_payload": 1048576}).encode() + b"\r\n",
    b"MSG  spaced.subject  2   5\r\nhello\r\n",  # unusual spacing: nats-py's regex path
    b"HMSG\tx 4 \t12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
)


def _stream(seed: int, n: int = 300) -> bytes:
    rng = random.Random(seed)
    return b"".join(_message(rng) if rng.random() < 0.85 else rng.choice(OTHERS) for _ in range(n))


def _chunks(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(data):
        step = rng.choice((1, 2, 7, 50, 333, 4096, 32768))
        out.append(data[at : at + step])
        at += step
    return out


async def _parse(parser: Parser, chunks: list[bytes]) -> None:
    for chunk in chunks:
        await parser.parse(chunk)


def test_the_nats_py_parser_has_what_the_direct_one_shares_with_it() -> None:
    assert parser_internals_present()


@pytest.mark.parametrize("seed", range(25))
def test_the_same_messages_and_ops_in_the_same_order_however_the_reads_are_cut(seed: int) -> None:
    data = _stream(seed)
    reference, ours = Recorder(direct=False), Recorder(direct=True)
    asyncio.run(_parse(Parser(reference), [data]))
    asyncio.run(_parse(DirectParser(ours), _chunks(data, seed)))  # type: ignore[arg-type]
    assert ours.seen == reference.seen
    assert len(reference.seen) >= 250
    # the direct subscriptions' messages went to their functions, counted as nats-py counts them
    to_direct = sum(sid in DIRECT_SIDS for sid in reference.sids)
    assert to_direct > 0 and ours.stats["in_msgs"] == to_direct
    assert not set(ours.sids) & set(DIRECT_SIDS) and len(ours.sids) == len(reference.sids) - to_direct


def test_a_message_split_anywhere_is_delivered_once_whole() -> None:
    frame = b"HMSG _INBOX.a 1 $JS.ACK.R.c.1.5.5.1.0 12 17\r\nNATS/1.0\r\n\r\nhello\r\n"
    for cut in range(1, len(frame)):
        ours = Recorder(direct=True)
        asyncio.run(_parse(DirectParser(ours), [frame[:cut], frame[cut:]]))  # type: ignore[arg-type]
        assert ours.seen == [("msg", b"_INBOX.a", b"$JS.ACK.R.c.1.5.5.1.0", b"hello", b"NATS/1.0\r\n\r\n")], (
            cut
        )


def test_an_unknown_line_is_a_protocol_error_as_in_nats_py() -> None:
    for parser_class in (Parser, DirectParser):
        with pytest.raises(ProtocolError):
            asyncio.run(_parse(parser_class(Recorder(direct=True)), [b"BOGUS 1 2\r\n"]))


def test_headers_longer_than_the_message_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        asyncio.run(_parse(DirectParser(Recorder(direct=True)), [b"HMSG a 1 20 10\r\n"]))  # type: ignore[arg-type]


def test_a_reset_while_a_parse_awaits_keeps_nothing_of_the_old_connection() -> None:
    class ResettingRecorder(Recorder):
        async def _process_ping(self) -> None:  # a reconnect starts while this op is handled
            await super()._process_ping()
            parser.reset()

    recorder = ResettingRecorder(direct=True)
    parser = DirectParser(recorder)  # type: ignore[arg-type]
    asyncio.run(_parse(parser, [b"PING\r\nMSG a 1 5\r\nhel"]))
    assert parser.buf == bytearray() and recorder.seen == [("ping",)]
    assert parser.state == AWAITING_CONTROL_LINE and parser.needed == 0, "the new connection starts afresh"
