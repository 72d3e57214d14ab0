"""Requests through ``replymux`` on a real nats-server: replies reach their own requests (with their
headers), a request nobody answers times out as nats-py's would, one with no responder says so, a late
reply is dropped, and the stream's acknowledgements come back to many appends at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.eventlog.connection import FastHeadersClient
from rallypoint.events import JobSpec, JobSubmitted, subjects
from rallypoint.infra import NatsServer


async def _echo(server: Client, subject: str, *, delay: float = 0.0) -> asyncio.Event:
    """Answer ``subject`` after ``delay``; the event is set once an answer has been sent."""
    answered = asyncio.Event()

    async def answer(msg: Msg) -> None:
        await asyncio.sleep(delay)
        await msg.respond(b"re:" + msg.data)
        await server.flush()
        answered.set()

    await server.subscribe(subject, cb=answer)
    await server.flush()
    return answered


@pytest.fixture
async def pair(nats_server: NatsServer) -> AsyncIterator[tuple[Client, Client]]:
    """A plain nats-py connection that answers, and ours that asks."""
    server = await nats.connect(nats_server.url)
    client = await connect_nats(nats_server.url, name="asker")
    try:
        assert isinstance(client, FastHeadersClient)
        yield server, client
    finally:
        await client.close()
        await server.close()


async def test_each_reply_reaches_its_own_request(pair: tuple[Client, Client]) -> None:
    server, client = pair
    await _echo(server, "echo")
    asked = (client.request("echo", str(i).encode(), timeout=10) for i in range(200))
    answers = await asyncio.gather(*asked)
    assert [a.data for a in answers] == [f"re:{i}".encode() for i in range(200)]
    assert client._resp_map == {}  # nothing left waiting


async def test_a_reply_with_headers_keeps_them(pair: tuple[Client, Client]) -> None:
    server, client = pair

    async def answer(msg: Msg) -> None:
        await server.publish(msg.reply, b"ok", headers={"Rally-Test": "yes"})

    await server.subscribe("with-headers", cb=answer)
    await server.flush()
    reply = await client.request("with-headers", b"", timeout=10)
    assert reply.data == b"ok" and reply.headers == {"Rally-Test": "yes"}


async def test_no_responder_and_no_answer_raise_as_nats_py_does(pair: tuple[Client, Client]) -> None:
    server, client = pair
    with pytest.raises(nats.errors.NoRespondersError):
        await client.request("nobody.listens", b"", timeout=10)
    late = await _echo(server, "slow", delay=1.0)
    with pytest.raises(nats.errors.TimeoutError):
        await client.request("slow", b"x", timeout=0.2)
    await asyncio.wait_for(late.wait(), 30)
    await _echo(server, "fast")
    # the same connection sent the late answer first, so this one's reply comes after it was dropped
    assert (await client.request("fast", b"y", timeout=10)).data == b"re:y"
    assert client._resp_map == {}


async def test_concurrent_appends_get_their_own_sequences(nats_server: NatsServer) -> None:
    log = await EventLog.connect(nats_server.url, name="appender")
    spec = JobSpec(name="m", team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
    try:
        events = [JobSubmitted(job_id=f"mux-{i}", spec=spec, submitted_at=1.0) for i in range(100)]
        seqs = await asyncio.gather(
            *(log.append(subjects.job(e.job_id), e, msg_id=e.job_id, source="test") for e in events)
        )
        assert sorted(seqs) == list(range(min(seqs), min(seqs) + 100))
        stored = {item.event.job_id: item.seq async for item in log.replay(to_seq=max(seqs))}  # type: ignore[union-attr]
        assert all(stored[e.job_id] == seq for e, seq in zip(events, seqs, strict=True))
    finally:
        await log.close()
