"""``ReadPacing`` decides when a connection's reader waits: only after a read that emptied the socket,
only while nothing on the connection awaits an answer, never when set to 0, and no longer than asked or
than the next request (``interrupt``); a standby that leads reads at once (``suspended``)."""

from __future__ import annotations

import asyncio
import time

from rallypoint.eventlog.pacing import ReadPacing
from rallypoint.runtime.cohost import fold_read_at_once
from rallypoint.runtime.config import ServiceConfig

CHUNK = 32768


async def _took(pacing: ReadPacing, size: int, awaiting: bool = False) -> float:
    start = time.monotonic()
    await pacing.after_read(size, CHUNK, lambda: awaiting)
    return time.monotonic() - start


async def test_a_read_that_emptied_the_socket_waits_the_pacing() -> None:
    pacing = ReadPacing(0.05)
    assert await _took(pacing, 100) >= 0.045
    assert pacing.pauses == 1


async def test_no_wait_when_off_when_the_buffer_was_full_or_when_a_reply_is_awaited() -> None:
    assert await _took(ReadPacing(0.0), 100) < 0.04
    pacing = ReadPacing(5.0)
    assert await _took(pacing, CHUNK) < 1.0  # more may be waiting: read it now
    assert await _took(pacing, 100, awaiting=True) < 1.0  # an acknowledgement must not wait out a pause
    assert pacing.pauses == 0


async def test_a_request_ends_a_pause() -> None:
    pacing = ReadPacing(30.0)
    pause = asyncio.create_task(pacing.after_read(100, CHUNK, lambda: False))
    await asyncio.sleep(0.05)
    assert not pause.done()
    pacing.interrupt()
    await asyncio.wait_for(pause, 5.0)
    assert pacing.pauses == 1


async def test_suspended_reads_at_once_and_restores_the_setting() -> None:
    pacing = ReadPacing(30.0)
    pause = asyncio.create_task(pacing.after_read(100, CHUNK, lambda: False))
    await asyncio.sleep(0.05)
    with pacing.suspended():
        await asyncio.wait_for(pause, 5.0)  # the pause under way ends too
        assert pacing.seconds == 0.0
        assert await _took(pacing, 100) < 1.0
    assert pacing.seconds == 30.0


def test_a_hosts_shared_fold_is_read_as_its_least_paced_service_reads() -> None:
    async def main(_ctx: object) -> int:
        return 0

    hosted = [(main, ServiceConfig(service=name)) for name in ("predictor", "job-controller", "inventory")]
    first, *rest = fold_read_at_once(hosted)
    assert first[1].service == "predictor" and first[1].pacing_s == 0.0  # the job controller's: none
    assert [config.pacing_s for _, config in rest] == [0.0, 0.02]
    alone = fold_read_at_once([(main, ServiceConfig(service="predictor"))])
    assert alone[0][1].pacing_s == 0.02
