"""How the projector cuts what it reads into batches (no log, no database: the batching alone)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from rallypoint.projection import LogReader, Projector
from rallypoint.projection.projector import _End, _Item


def _projector(batch_size: int, batch_wait: float) -> Projector:
    # _next_batch reads only its queue; the log and the database are never touched here.
    return Projector(cast(LogReader, None), "", batch_size=batch_size, batch_wait=batch_wait)


async def test_records_already_queued_fill_a_batch_without_waiting_for_the_window() -> None:
    """A burst already read is written in batches of ``batch_size`` at once, whatever the window, and a
    batch that cannot fill closes when its window does, its pending read kept for the next one."""
    projector = _projector(batch_size=5, batch_wait=0.05)
    queue: asyncio.Queue[_Item] = asyncio.Queue()
    for n in range(12):
        queue.put_nowait(cast(Any, n))
    loop = asyncio.get_running_loop()

    started = loop.time()
    first, ended, getter = await projector._next_batch(queue, None, None)
    second, _, getter = await projector._next_batch(queue, getter, None)
    assert (first, second, ended, getter) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9], False, None)
    assert loop.time() - started < 0.05  # full batches never wait out the window

    third, ended, getter = await projector._next_batch(queue, getter, None)
    assert (third, ended) == ([10, 11], False)
    assert loop.time() - started >= 0.05  # the last two waited for more until the window closed
    assert getter is not None and not getter.done()

    queue.put_nowait(_End())
    rest, ended, getter = await projector._next_batch(queue, getter, None)
    assert (rest, ended, getter) == ([], True, None)


async def test_a_zero_window_still_takes_what_is_queued() -> None:
    """``batch_wait`` 0: no waiting for more, but everything already read goes in one batch."""
    projector = _projector(batch_size=100, batch_wait=0.0)
    queue: asyncio.Queue[_Item] = asyncio.Queue()
    for n in range(7):
        queue.put_nowait(cast(Any, n))
    records, ended, getter = await projector._next_batch(queue, None, None)
    assert (records, ended) == (list(range(7)), False)
    assert getter is not None
    getter.cancel()
