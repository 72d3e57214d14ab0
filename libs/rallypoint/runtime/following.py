"""The common body of a stateful service: keep a Follower at the log's tip while ``work`` runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from .follower import Follower
from .service import ServiceContext


async def with_follower(ctx: ServiceContext, work: Callable[[Follower], Awaitable[None]]) -> int:
    """Catch up (from the service's snapshot if one exists), follow in the background, run ``work``."""
    log = await ctx.event_log()
    follower = Follower(log)
    await follower.catch_up()
    following = asyncio.create_task(follower.run())
    try:
        await work(follower)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await following
    return 0
