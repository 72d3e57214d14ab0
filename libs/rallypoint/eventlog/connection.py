"""One NATS connection policy for every service: reconnect forever, ping often, log every callback."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client

from .errors import LogUnavailable

_log = logging.getLogger("rallypoint.nats")

PING_INTERVAL_S = 2  # nats-py's default (120 s) notices a dead server only after minutes
MAX_OUTSTANDING_PINGS = 3
RECONNECT_WAIT_S = 0.5


async def connect_nats(url: str | list[str], *, name: str, initial_timeout: float | None = 10.0) -> Client:
    """Connect with the project's policy; raise ``LogUnavailable`` if no server answers in time.

    With ``max_reconnect_attempts=-1`` nats-py also retries the *first* connect forever, silently;
    ``initial_timeout`` bounds that so a CLI or a test gets a clear error (``None``: wait forever,
    what a long-running service wants when it starts before its server).
    """
    nc = Client()

    async def error_cb(exc: Exception) -> None:
        # One line, no traceback: nats-py reports every failed reconnect attempt here.
        _log.warning("nats error (%s): %s: %s", name, type(exc).__name__, exc)

    async def disconnected_cb() -> None:
        _log.warning("nats disconnected (%s)", name)

    async def reconnected_cb() -> None:
        _log.info("nats reconnected (%s) to %s", name, nc.connected_url.netloc if nc.connected_url else "?")

    async def closed_cb() -> None:
        _log.info("nats connection closed (%s)", name)

    connect = nc.connect(
        servers=url if isinstance(url, list) else [url],
        name=name,
        error_cb=error_cb,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        closed_cb=closed_cb,
        max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]  # nats-py annotates int, takes float
        ping_interval=PING_INTERVAL_S,
        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        connect_timeout=2,
    )
    try:
        if initial_timeout is None:
            await connect
        else:
            await asyncio.wait_for(connect, initial_timeout)
    except (TimeoutError, OSError) as exc:
        with contextlib.suppress(Exception):  # nats-py may raise while closing a dead connection
            await nc.close()
        raise LogUnavailable(f"no NATS server answered at {url} within {initial_timeout}s") from exc
    return nc
