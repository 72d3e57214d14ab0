"""``subscribe_direct`` on a real nats-server: the handler gets each message's subject and payload, in
order, whether the connection is ours (handed over as parsed) or a plain nats-py one (a callback)."""

from __future__ import annotations

import asyncio

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

    def hear(subject: bytes, data: bytes) -> None:
        heard.append((subject, data))
        if len(heard) == 100:
            done.set()

    try:
        sub = await subscribe_direct(listener, "hb.*", hear)
        await listener.flush()
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
