"""One NATS connection policy for every service: reconnect forever, ping often, log every callback.

Credentials: a URL may carry ``user:password@``; otherwise ``NatsCredentials`` (a service's
``--nats-user`` / ``--nats-password-file``, or ``RALLY_NATS_USER`` with ``RALLY_NATS_PASSWORD`` or
``RALLY_NATS_PASSWORD_FILE``) apply to every server in the list. A password never goes on a command line,
where any local user could read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from nats.aio.client import Client

from .errors import LogUnavailable

_log = logging.getLogger("rallypoint.nats")

PING_INTERVAL_S = 2  # nats-py's default (120 s) notices a dead server only after minutes
MAX_OUTSTANDING_PINGS = 3
RECONNECT_WAIT_S = 0.5


@dataclass(frozen=True, slots=True)
class NatsCredentials:
    """A NATS user and password, for servers whose URLs carry none."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def from_env(cls, env: os._Environ[str] | dict[str, str] | None = None) -> NatsCredentials | None:
        """``RALLY_NATS_USER`` with ``RALLY_NATS_PASSWORD`` or ``RALLY_NATS_PASSWORD_FILE``; None if unset."""
        env = os.environ if env is None else env
        user = env.get("RALLY_NATS_USER", "")
        if not user:
            return None
        return cls.load(user, env.get("RALLY_NATS_PASSWORD"), env.get("RALLY_NATS_PASSWORD_FILE"))

    @classmethod
    def load(cls, user: str, password: str | None, password_file: str | None) -> NatsCredentials:
        """From a password or a file holding it (a mounted secret: one line, trailing newline ignored)."""
        if password_file:
            password = Path(password_file).read_text().strip()
        if not password:
            raise ValueError(f"NATS user {user!r} has no password (RALLY_NATS_PASSWORD or a password file)")
        return cls(user, password)


async def connect_nats(
    url: str | list[str],
    *,
    name: str,
    initial_timeout: float | None = 10.0,
    credentials: NatsCredentials | None = None,
) -> Client:
    """Connect with the project's policy; raise ``LogUnavailable`` if no server answers in time.

    ``credentials`` default to the environment's (``NatsCredentials.from_env``).

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

    servers = url if isinstance(url, list) else [url]
    # Credentials in a URL win (nats-py would otherwise let user/password override them).
    if not any(urlsplit(server).username for server in servers):
        credentials = credentials or NatsCredentials.from_env()
    else:
        credentials = None
    connect = nc.connect(
        servers=servers,
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
        user=credentials.user if credentials else None,
        password=credentials.password if credentials else None,
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
