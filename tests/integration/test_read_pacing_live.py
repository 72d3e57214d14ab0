"""Read pacing on a real nats-server: a paced connection that follows a trickle of messages reads them in
fewer, fuller reads and misses none, and its own requests (an append's acknowledgement, a request to a
service) are answered as fast as on an unpaced one, however long its pauses."""

from __future__ import annotations

import asyncio
import time

from rallypoint.eventlog import connect_nats
from rallypoint.eventlog.connection import FastHeadersClient, subscribe_direct
from rallypoint.infra import NatsServer

TRICKLE = 60


async def test_a_paced_listener_hears_every_message_of_a_trickle(nats_server: NatsServer) -> None:
    listener = await connect_nats(nats_server.url, name="paced-ears")
    writer = await connect_nats(nats_server.url, name="trickle")
    assert isinstance(listener, FastHeadersClient)
    listener.pacing.seconds = 0.05
    heard: list[bytes] = []
    done = asyncio.Event()

    def hear(_subject: bytes, data: bytes) -> None:
        heard.append(data)
        if len(heard) == TRICKLE:
            done.set()

    try:
        await subscribe_direct(listener, "trickle.*", hear)
        await listener.flush()
        for i in range(TRICKLE):
            await writer.publish(f"trickle.{i % 4}", str(i).encode())
            await writer.flush()
            await asyncio.sleep(0.005)  # a trickle: one message per read without pacing
        await asyncio.wait_for(done.wait(), 30.0)
    finally:
        await writer.close()
        await listener.close()
    assert heard == [str(i).encode() for i in range(TRICKLE)]
    # paused after reads that emptied the socket; each pause let several messages gather
    assert 0 < listener.pacing.pauses < TRICKLE


async def test_requests_on_a_paced_connection_are_not_held_by_its_pauses(nats_server: NatsServer) -> None:
    answerer = await connect_nats(nats_server.url, name="answerer")
    asker = await connect_nats(nats_server.url, name="paced-asker")
    assert isinstance(asker, FastHeadersClient)
    asker.pacing.seconds = 10.0  # far longer than any round trip here

    async def answer(msg: object) -> None:
        await msg.respond(b"pong")  # type: ignore[attr-defined]

    try:
        await answerer.subscribe("svc.ping", cb=answer)
        await answerer.flush()
        # background traffic so the asker's reader pauses between reads
        await asker.subscribe("noise")
        await asker.flush()
        for _ in range(3):
            await answerer.publish("noise", b"x")
            await answerer.flush()
            await asyncio.sleep(0.05)
        started = time.monotonic()
        for _ in range(5):
            reply = await asker.request("svc.ping", b"ping", timeout=5.0)
            assert reply.data == b"pong"
        took = time.monotonic() - started
    finally:
        await asker.close()
        await answerer.close()
    assert asker.pacing.pauses > 0
    assert took < 5.0  # one pause held any of them would be 10 s
