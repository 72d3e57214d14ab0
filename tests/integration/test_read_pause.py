"""A connection that rests after each read (``FastHeadersClient.read_pause_s``) on a real nats-server: what
arrives while it rests is read in one go, in order and whole; requests are still answered; a leader reads
eagerly while it leads and rests again after (``eager_reads``); and every service gets its own pause unless
told otherwise (``ServiceConfig``)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from rallypoint.eventlog import connect_nats
from rallypoint.eventlog.connection import FastHeadersClient, eager_reads, set_read_pause
from rallypoint.infra import NatsServer
from rallypoint.runtime.config import READ_PAUSE_S, ServiceConfig, add_common_args

PAUSE_S = 0.05
MESSAGES = 200


def _count_reads(nc: Client) -> list[int]:
    """Counts the connection's reads (each read is handed to its parser once)."""
    reads = [0]
    parse: Callable[[bytes], Awaitable[None]] = nc._ps.parse

    async def counted(data: bytes = b"") -> None:
        reads[0] += 1
        await parse(data)

    nc._ps.parse = counted  # type: ignore[method-assign]
    return reads


async def _trickle(nats_server: NatsServer, pause_s: float) -> tuple[list[bytes], int, float]:
    """(the payloads a connection resting ``pause_s`` received, its reads, seconds taken) for messages
    published one every 2 ms."""
    reader = await connect_nats(nats_server.url, name="resting")
    writer = await connect_nats(nats_server.url, name="trickle")
    try:
        assert isinstance(reader, FastHeadersClient)
        set_read_pause(reader, pause_s)
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(msg: Msg) -> None:
            got.append(msg.data)
            if len(got) == MESSAGES:
                done.set()

        await reader.subscribe("trickle", cb=on_message)
        await reader.flush()
        reads = _count_reads(reader)
        started = time.monotonic()
        for i in range(MESSAGES):
            await writer.publish("trickle", str(i).encode())
            await writer.flush()
            await asyncio.sleep(0.002)
        await asyncio.wait_for(done.wait(), 30.0)
        return got, reads[0], time.monotonic() - started
    finally:
        await writer.close()
        await reader.close()


async def test_a_resting_connection_reads_what_arrived_meanwhile_in_one_go(nats_server: NatsServer) -> None:
    got, reads, took = await _trickle(nats_server, PAUSE_S)
    assert got == [str(i).encode() for i in range(MESSAGES)]
    # one read per rest at most (and the pings' few), however the 200 messages were spread
    assert reads <= took / PAUSE_S + 5, (reads, took)


async def test_an_eager_connection_reads_as_bytes_arrive(nats_server: NatsServer) -> None:
    got, reads, _ = await _trickle(nats_server, 0.0)
    assert got == [str(i).encode() for i in range(MESSAGES)]
    assert reads >= MESSAGES // 10  # ~one read a message (200 on an idle machine): what the rest saves


async def test_a_resting_connection_still_gets_its_replies(nats_server: NatsServer) -> None:
    server = await connect_nats(nats_server.url, name="answers")
    client = await connect_nats(nats_server.url, name="asks")
    try:
        set_read_pause(client, PAUSE_S)

        async def answer(msg: Msg) -> None:
            await msg.respond(msg.data.upper())

        await server.subscribe("ask", cb=answer)
        await server.flush()
        for word in (b"one", b"two", b"three"):
            reply = await client.request("ask", word, timeout=5.0)
            assert reply.data == word.upper()
    finally:
        await client.close()
        await server.close()


async def test_a_leader_reads_eagerly_and_rests_again_after(nats_server: NatsServer) -> None:
    nc = await connect_nats(nats_server.url, name="standby")
    try:
        assert isinstance(nc, FastHeadersClient)
        set_read_pause(nc, PAUSE_S)
        with eager_reads(nc):
            assert nc.read_pause_s == 0.0
        assert nc.read_pause_s == PAUSE_S
        with pytest.raises(RuntimeError), eager_reads(nc):
            raise RuntimeError("stepped down")
        assert nc.read_pause_s == PAUSE_S
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("service", "argv", "expected"),
    [
        ("inventory", [], READ_PAUSE_S["inventory"]),
        ("scheduler", [], READ_PAUSE_S["scheduler"]),
        ("api", [], 0.0),
        ("job-controller", [], 0.0),
        ("inventory", ["--read-pause-ms", "0"], 0.0),
        ("api", ["--read-pause-ms", "5"], 0.005),
    ],
)
def test_each_service_rests_as_long_as_its_own_table_says_unless_told(
    service: str, argv: list[str], expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RALLY_READ_PAUSE_MS", raising=False)
    args = add_common_args(argparse.ArgumentParser()).parse_args(argv)
    assert ServiceConfig.from_args(service, args).read_pause_s == pytest.approx(expected)
