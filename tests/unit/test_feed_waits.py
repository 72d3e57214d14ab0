"""The follow's buffer (``_Feed``) waits with one timer for all its waits: each wait still ends with its
own messages or at its own deadline, never sooner and not much later."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from rallypoint.eventlog.feeds import _Feed

SLACK = 0.15  # a loaded 2-core machine may run a timer late, never early


def _msg(n: int) -> Any:
    return n  # the feed only buffers what the subscription hands it


def _deliver_later(feed: _Feed, delay: float, n: int) -> None:
    """The subscription's callback handing message ``n`` to the feed ``delay`` seconds from now."""
    asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(feed.cb(_msg(n))))


async def test_a_wait_ends_with_what_arrives() -> None:
    feed = _Feed()
    _deliver_later(feed, 0.02, 1)
    assert await feed.batch(5.0) == [1]
    await feed.cb(_msg(2))
    await feed.cb(_msg(3))
    assert await feed.batch(5.0) == [2, 3]  # buffered: no wait at all


async def test_an_idle_wait_times_out_at_its_own_deadline() -> None:
    feed = _Feed()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await feed.batch(0.1)
    assert 0.1 <= time.monotonic() - started < 0.1 + SLACK


async def test_after_many_short_waits_an_idle_one_still_waits_its_whole_timeout() -> None:
    """The timer set by the first wait fires during later ones: it must move on, not end them."""
    feed = _Feed()
    for n in range(12):  # 12 waits, each ended by a message after 0.02 s: 0.24 s, past the first deadline
        _deliver_later(feed, 0.02, n)
        assert await feed.batch(0.15) == [n]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await feed.batch(0.15)
    assert 0.15 <= time.monotonic() - started < 0.15 + SLACK


async def test_a_shorter_timeout_after_a_longer_one_is_kept() -> None:
    feed = _Feed()
    _deliver_later(feed, 0.01, 1)
    assert await feed.batch(30.0) == [1]  # leaves a timer set 30 s ahead
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await feed.batch(0.05)
    assert 0.05 <= time.monotonic() - started < 0.05 + SLACK


async def test_a_cancelled_wait_leaves_the_feed_usable() -> None:
    feed = _Feed()
    waiting = asyncio.ensure_future(feed.batch(0.05))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.08)  # the cancelled wait's deadline passes with nobody waiting
    await feed.cb(_msg(7))
    assert await feed.batch(0.05) == [7]
    with pytest.raises(TimeoutError):
        await feed.batch(0.05)
