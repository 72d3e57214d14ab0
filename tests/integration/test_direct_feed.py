"""The follow's own ordered push consumer (``feeds.DirectFeed``) on a real nats-server: every message in
order through the server's flow control with a small buffer, a lost consumer recovered by the follow,
and a lost delivery or a heartbeat naming one turned into a reset rather than a silent skip."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.eventlog import Append, EventLog
from rallypoint.eventlog.connection import FastHeadersClient
from rallypoint.eventlog.feeds import DirectFeed, FeedReset
from rallypoint.events import JobCancelRequested, subjects
from rallypoint.events.subjects import STREAM_SUBJECTS


def _cancels(start: int, n: int) -> list[Append]:
    return [
        Append(subjects.job(f"j{i}"), JobCancelRequested(job_id=f"j{i}", at=1.0), f"j{i}:c")
        for i in range(start, start + n)
    ]


async def _fill(log: EventLog, n: int) -> int:
    last = 0
    for start in range(0, n, 1000):
        last = (await log.append_batch(_cancels(start, min(1000, n - start)), source="t")).last_seq
    return last


async def test_a_slow_reader_gets_every_message_and_answers_flow_control(
    event_log: EventLog,
) -> None:
    assert isinstance(event_log.nc, FastHeadersClient)
    last = await _fill(event_log, 20_000)
    feed = DirectFeed(event_log.nc, event_log.js, event_log.stream, limit=64)
    await feed.open(STREAM_SUBJECTS, 1)
    seqs: list[int] = []
    try:
        while len(seqs) < last:
            seqs.extend(d.seq for d in await feed.batch(10.0))
            await asyncio.sleep(0.001)  # a fold slower than the server: its flow control must wait
    finally:
        await feed.close()
    assert seqs == list(range(1, last + 1))
    assert feed.stalls == 0  # every flow control request was answered: the server never waited on one


async def test_the_follow_resubscribes_when_its_consumer_is_deleted(event_log: EventLog) -> None:
    first = await _fill(event_log, 10)
    seen: list[int] = []

    async def follow() -> None:
        async for rec in event_log.follow(from_seq=1, probe_interval=0.5):
            seen.append(rec.seq)

    task = asyncio.create_task(follow())
    try:
        while len(seen) < first:
            await asyncio.sleep(0.05)
        consumers = await event_log.js.consumers_info(event_log.stream)
        for info in consumers:  # what a server restart does to an in-memory consumer
            await event_log.js.delete_consumer(event_log.stream, info.name)
        last = await _fill_more(event_log, 10, 10)
        async with asyncio.timeout(15):
            while len(seen) < last:
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert seen == list(range(1, last + 1))


async def _fill_more(log: EventLog, start: int, n: int) -> int:
    return (await log.append_batch(_cancels(start, n), source="t")).last_seq


async def test_a_skipped_delivery_or_a_heartbeat_naming_one_resets_the_feed(event_log: EventLog) -> None:
    assert isinstance(event_log.nc, FastHeadersClient)
    await _fill(event_log, 3)
    for lost in ("delivery", "heartbeat"):
        feed = DirectFeed(event_log.nc, event_log.js, event_log.stream)
        await feed.open(STREAM_SUBJECTS, 1)
        try:
            assert [d.seq for d in await feed.batch(5.0)] == [1, 2, 3]
            if lost == "delivery":  # delivery 5 where 4 is next: the server's 4th never came
                reply = b"$JS.ACK.RALLY.c.1.9.5.1700000000000000000.0"
                feed._on_message(b"rally.job.x", reply, b"{}", b"NATS/1.0\r\nce-id: x\r\n\r\n")
            else:
                heartbeat = (
                    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 4\r\nNats-Last-Stream: 9\r\n\r\n"
                )
                feed._on_message(b"inbox", b"", b"", heartbeat)
            with pytest.raises(FeedReset):
                await feed.batch(5.0)
        finally:
            await feed.close()


async def test_a_consumer_gone_silent_resets_the_feed(event_log: EventLog) -> None:
    assert isinstance(event_log.nc, FastHeadersClient)
    await _fill(event_log, 3)
    feed = DirectFeed(event_log.nc, event_log.js, event_log.stream, heartbeat_s=0.2)
    await feed.open(STREAM_SUBJECTS, 1)
    try:
        assert [d.seq for d in await feed.batch(5.0)] == [1, 2, 3]
        with pytest.raises(TimeoutError):
            await feed.batch(0.7)  # idle but heartbeating: only a timeout, no reset
        for info in await event_log.js.consumers_info(event_log.stream):
            await event_log.js.delete_consumer(event_log.stream, info.name)  # no more heartbeats
        with pytest.raises(FeedReset, match="nothing heard"):
            await feed.batch(5.0)
    finally:
        await feed.close()
