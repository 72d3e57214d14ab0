"""``subscribe_direct`` on a real nats-server: the handler gets each message's subject and payload, in
order, whether the connection is ours (handed over as parsed) or a plain nats-py one (a callback)."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest
from nats.aio.client import Client

from rallypoint.eventlog import connect_nats
from rallypoint.eventlog.connection import FastHeadersClient, subscribe_direct
from rallypoint.infra import NatsServer


async def _heard(listener: Client, nats_server: NatsServer) -> list[tuple[bytes, bytes]]:
    writer = await connect_nats(nats_server.url, name="beats")
    heard: list[tuple[bytes, bytes]] = []
    done = asyncio.Event()

    probed = asyncio.Event()

    def hear(subject: bytes, data: bytes) -> None:
        if subject == b"hb.probe":
            probed.set()
            return
        heard.append((subject, data))
        if len(heard) == 100:
            done.set()

    try:
        sub = await subscribe_direct(listener, "hb.*", hear)
        await listener.flush()
        # The server has the subscription once a probe is heard: nats-py's own client (the plain variant)
        # may answer a flush before its SUB left (see the test below), which would lose the first messages
        while not probed.is_set():
            await writer.publish("hb.probe", b"")
            await writer.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probed.wait(), 0.05)
        for i in range(100):
            await writer.publish(f"hb.n{i % 3}", str(i).encode())
        await writer.flush()
        await asyncio.wait_for(done.wait(), 30.0)
        await sub.unsubscribe()
    finally:
        await writer.close()
    return heard


@pytest.mark.parametrize("ours", [True, False])
async def test_the_handler_hears_every_message_in_order(nats_server: NatsServer, ours: bool) -> None:
    url = nats_server.url
    listener = await connect_nats(url, name="ears") if ours else await nats.connect(url)
    try:
        assert isinstance(listener, FastHeadersClient) is ours
        heard = await _heard(listener, nats_server)
    finally:
        await listener.close()
    assert heard == [(f"hb.n{i % 3}".encode(), str(i).encode()) for i in range(100)]


async def test_a_flush_answers_only_after_what_was_sent_before_it(nats_server: NatsServer) -> None:
    """Our client writes the commands queued for its flusher before a flush's PING (nats-py 2.16 writes the
    PING at once, ahead of them): a subscription made just before a flush is the server's when the flush
    returns, which the services' "subscribed, flushed, ready" relies on."""
    nc = await connect_nats(nats_server.url, name="order")
    assert isinstance(nc, FastHeadersClient)
    written: list[bytes] = []
    transport = nc._transport
    assert transport is not None
    write, writelines = transport.write, transport.writelines

    def record_write(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    def record_writelines(chunks: list[bytes]) -> None:
        written.extend(bytes(chunk) for chunk in chunks)
        writelines(chunks)

    transport.write = record_write  # type: ignore[method-assign]
    transport.writelines = record_writelines  # type: ignore[method-assign]
    try:
        await nc.subscribe("order.check")
        await nc.flush()  # no turn of the loop between the two: the flusher task has not run yet
        wire = b"".join(written)
        assert b"SUB order.check" in wire and b"PING" in wire, wire
        assert wire.index(b"SUB order.check") < wire.index(b"PING"), wire
    finally:
        transport.write, transport.writelines = write, writelines  # type: ignore[method-assign]
        await nc.close()
