"""``ReadIndex``: concurrent readers share one question to the log, and a reader is only ever answered by
a question sent after it arrived (an earlier one may have been answered before a write it must see).

The question here is a function under the test's control (the log's side, with a real NATS server, is
tests/integration/test_api_replicas.py): each call returns the next tip, once the test releases it.
"""

from __future__ import annotations

import asyncio

import pytest
from rallypoint_services.api.readindex import ReadIndex

from rallypoint.eventlog import LogUnavailable


class GatedLog:
    """Answers question k with tip 100 * k, when the test lets it; or raises what the test gives it."""

    def __init__(self) -> None:
        self.asked = 0
        self.release = asyncio.Event()
        self.failure: Exception | None = None

    async def tip(self) -> int:
        self.asked += 1
        number = self.asked
        await self.release.wait()
        if self.failure is not None:
            raise self.failure
        return 100 * number


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrent_readers_share_one_question() -> None:
    log = GatedLog()
    index = ReadIndex(log.tip)
    readers = [asyncio.create_task(index.latest(5.0)) for _ in range(50)]
    await _settle()
    log.release.set()
    assert await asyncio.gather(*readers) == [100] * 50
    assert log.asked == index.asked == 1
    assert index.reads == 50


async def test_a_reader_arriving_after_the_question_went_out_waits_for_the_next() -> None:
    log = GatedLog()
    index = ReadIndex(log.tip)
    first = asyncio.create_task(index.latest(5.0))
    await _settle()
    assert log.asked == 1  # on the wire
    later = [asyncio.create_task(index.latest(5.0)) for _ in range(10)]
    await _settle()
    assert log.asked == 1  # the later readers do not send their own questions while one is out
    log.release.set()
    assert await first == 100
    # All ten came after question 1 was sent: all are answered by question 2, the only one more.
    assert await asyncio.gather(*later) == [200] * 10
    assert log.asked == 2
    assert await index.latest(5.0) == 300  # idle again: a new reader asks at once


async def test_a_failed_question_fails_its_readers_and_the_next_is_asked() -> None:
    log = GatedLog()
    index = ReadIndex(log.tip)
    first = asyncio.create_task(index.latest(5.0))
    await _settle()
    later = asyncio.create_task(index.latest(5.0))
    await _settle()
    log.failure = LogUnavailable("gone")
    log.release.set()
    with pytest.raises(LogUnavailable):
        await first
    with pytest.raises(LogUnavailable):
        await later  # question 2 failed too: the log is still gone
    log.failure = None
    assert await index.latest(5.0) == 300


async def test_a_reader_that_gives_up_does_not_cancel_the_others() -> None:
    log = GatedLog()
    index = ReadIndex(log.tip)
    patient = asyncio.create_task(index.latest(5.0))
    await _settle()
    with pytest.raises(LogUnavailable, match=r"within 0\.1s"):
        await index.latest(0.1)
    log.release.set()
    assert await patient == 100


async def test_close_cancels_the_question_on_the_wire() -> None:
    log = GatedLog()
    index = ReadIndex(log.tip)
    reader = asyncio.create_task(index.latest(5.0))
    await _settle()
    await index.close()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert log.asked == 1  # and no further question went out
