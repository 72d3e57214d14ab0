"""One NATS connection policy for every service: reconnect forever, ping often, log every callback.

Credentials: a URL may carry ``user:password@``; otherwise ``NatsCredentials`` (a service's
``--nats-user`` / ``--nats-password-file``, or ``RALLY_NATS_USER`` with ``RALLY_NATS_PASSWORD`` or
``RALLY_NATS_PASSWORD_FILE``) apply to every server in the list. A password never goes on a command line,
where any local user could read it, nor in a log line or an error message (``without_password``).

Inboxes: each connection uses its user's own inbox prefix (``_INBOX.<user>``,
``rallypoint.security.permissions.inbox_prefix``), the only inboxes the permission matrix lets that user
subscribe to, so replies and consumer deliveries meant for one identity never reach another.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import nats.aio.client as nats_client
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import command as nats_command

from rallypoint.security.permissions import inbox_prefix

from .errors import LogUnavailable
from .pacing import ReadPacing
from .replymux import ReplyMux, reply_mux_internals_present
from .wire import DirectParser, parser_internals_present

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


# ``scheme://user:password@``: the password runs to the last ``@`` before the path or the next URL of a
# list, so one with an unescaped ``@`` is hidden whole too.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s,]*):[^\s,/]*@")


def without_password(url: str) -> str:
    """``url`` (or a comma-separated list of them, or a DSN) with every password replaced by ``***``: what
    may be printed or logged."""
    return _URL_PASSWORD.sub(r"\g<head>:***@", url)


def _bus_user(servers: list[str], credentials: NatsCredentials | None) -> str | None:
    """The NATS user a connection authenticates as: the first URL's that names one, else ``credentials``'."""
    for server in servers:
        user = urlsplit(server).username
        if user:
            return unquote(user)
    return credentials.user if credentials else None


async def connect_nats(
    url: str | list[str],
    *,
    name: str,
    initial_timeout: float | None = 10.0,
    credentials: NatsCredentials | None = None,
    read_pacing_s: float = 0.0,
) -> Client:
    """Connect with the project's policy; raise ``LogUnavailable`` if no server answers in time.

    ``credentials`` default to the environment's (``NatsCredentials.from_env``). ``read_pacing_s``: how
    long a read that emptied the socket waits before the next (``pacing.ReadPacing``; our client only).

    With ``max_reconnect_attempts=-1`` nats-py also retries the *first* connect forever, silently;
    ``initial_timeout`` bounds that so a CLI or a test gets a clear error (``None``: wait forever,
    what a long-running service wants when it starts before its server).
    """
    nc = CLIENT_CLASS()
    if isinstance(nc, FastHeadersClient):
        nc.pacing.seconds = read_pacing_s

    async def error_cb(exc: Exception) -> None:
        # One line, no traceback: nats-py reports every failed reconnect attempt here.
        _log.warning("nats error (%s): %s: %s", name, type(exc).__name__, exc)

    async def disconnected_cb() -> None:
        _log.warning("nats disconnected (%s)", name)

    async def reconnected_cb() -> None:
        url = nc.connected_url  # its netloc would carry the password: the host and port alone
        _log.info("nats reconnected (%s) to %s", name, f"{url.hostname}:{url.port}" if url else "?")

    async def closed_cb() -> None:
        _log.info("nats connection closed (%s)", name)

    # a string may list a cluster's seed servers, comma-separated (what `rally up --nats-servers 3` writes)
    servers = url if isinstance(url, list) else [part.strip() for part in url.split(",") if part.strip()]
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
        inbox_prefix=inbox_prefix(_bus_user(servers, credentials)),
    )
    try:
        if initial_timeout is None:
            await connect
        else:
            await asyncio.wait_for(connect, initial_timeout)
    except (TimeoutError, OSError) as exc:
        with contextlib.suppress(Exception):  # nats-py may raise while closing a dead connection
            await nc.close()
        where = without_password(url if isinstance(url, str) else ",".join(url))
        raise LogUnavailable(f"no NATS server answered at {where} within {initial_timeout}s") from exc
    return nc


# -- headers: every service parses ~10 on every event it follows, every writer builds them on each append --

#: A header block in the form every header we and the server write takes: ``Name: value`` lines, the name a
#: token, the value printable ASCII without spaces (so nothing for nats-py to strip, replace or decode
#: differently). Blank lines are skipped, as nats-py skips them; a last line may lack its CRLF.
_NAME = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_CANONICAL_BLOCK = re.compile(rf"(?:{_NAME}: [!-~]*\r\n|\r\n)*(?:{_NAME}: [!-~]*)?")
_CANONICAL_LINE = re.compile(rf"({_NAME}): ([!-~]*)(?:\r\n|\Z)")

#: ``NATS/1.0`` ends here; a space there starts an inline status, CRLF the header lines.
_STATUS_AT = len(b"NATS/1.0")
_FIRST_LINE = _STATUS_AT + 2

_NatsParse = Callable[[bytes], dict[str, str]]
#: nats-py's own parser (None in a nats-py without it: then the plain client is used).
_NATS_PARSE: _NatsParse | None = getattr(Client, "_parse_header_lines", None)


def parse_header_lines(raw: bytes, fallback: _NatsParse) -> dict[str, str]:
    """nats-py's ``Client._parse_header_lines`` (``fallback``), exactly, at half its cost for the blocks we
    see: a canonical block (``_CANONICAL_BLOCK``) parses with one regex pass, since for it nats-py's
    per-line partition, strip, whitespace check and decode all change nothing; anything else is nats-py's."""
    fields = _canonical_fields(raw)
    return fallback(raw) if fields is None else fields


def _canonical_fields(raw: bytes) -> dict[str, str] | None:
    """The headers of a canonical block (``_CANONICAL_BLOCK``); None for any other block."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if _CANONICAL_BLOCK.fullmatch(text) is None:
        return None
    return dict(_CANONICAL_LINE.findall(text))


def message_headers(raw: bytes | None) -> dict[str, str] | None:
    """The header lines of a delivered message's raw block (after ``NATS/1.0`` and any inline status), as
    nats-py would parse them; None when there are none."""
    if not raw:
        return None
    end = raw.find(b"\r\n")
    if end < 0:
        return None
    assert _NATS_PARSE is not None  # only our client hands raw blocks over, and only when it is there
    return parse_header_lines(raw[end + 2 :], _NATS_PARSE) or None


#: Takes a message a direct subscription receives: subject, reply, payload and the raw header block.
DirectHandler = Callable[[bytes, bytes, bytes, bytes | None], None]


def header_block(headers: Mapping[str, str]) -> bytes | None:
    """The header block nats-py's ``_send_publish`` writes for ``headers``, when every name is a token and
    every value printable ASCII without spaces (nothing for it to strip, skip or replace); else None."""
    try:
        text = "".join([name + ": " + value + "\r\n" for name, value in headers.items()])
    except TypeError:  # a value that is not a str: nats-py's own loop says what is wrong with it
        return None
    # One newline per header: a name or value holding CR/LF (which nats-py strips or replaces) could
    # otherwise still read as canonical lines.
    if text.count("\n") != len(headers) or _CANONICAL_BLOCK.fullmatch(text) is None:
        return None
    return b"NATS/1.0\r\n" + text.encode() + b"\r\n"


def _nats_internals_present() -> bool:
    """Whether the nats-py private API the fast paths rely on is the one they were written against: else
    the plain client is used (slower, same bytes and dicts)."""
    parse = inspect.getattr_static(Client, "_parse_header_lines", None)
    send = getattr(Client, "_send_publish", None)
    if not isinstance(parse, staticmethod) or _NATS_PARSE is None or send is None:
        return False
    if getattr(nats_client, "parse_email", None) is not None:
        return False  # nats-py parses with fast_mail_parser then, not with _parse_header_lines
    params = list(inspect.signature(send).parameters)
    expected = ["self", "subject", "reply", "payload", "payload_size", "headers"]
    process = getattr(Client, "_process_msg", None)
    if process is None or list(inspect.signature(process).parameters) != [
        "self", "sid", "subject", "reply", "data", "headers"
    ]:  # fmt: skip
        return False
    probe = Client()  # what pacing reads to know whether a reply is awaited
    awaited = (getattr(probe, "_resp_map", None), getattr(probe, "_pongs", None))
    if not isinstance(awaited[0], dict) or not isinstance(awaited[1], list):
        return False
    # what a flush's PING is written after (``_send_ping``)
    if not isinstance(getattr(probe, "_pending", None), list) or not hasattr(probe, "_pending_data_size"):
        return False
    if list(inspect.signature(Client._send_ping).parameters) != ["self", "future"]:
        return False
    if not reply_mux_internals_present(probe):
        return False
    return (
        params == expected
        and parser_internals_present()
        and callable(getattr(nats_command, "hpub_cmd", None))
        and all(
            callable(getattr(Client, name, None))
            for name in ("_send_command", "_flush_pending", "_process_headers")
        )
    )


class FastHeadersClient(Client):
    """nats-py's client, parsing and building message headers faster (same dicts, same bytes on the wire),
    and handing a direct subscription's messages over as they are parsed.

    A followed event costs every service ~10 us in nats-py's header parser (half of it a per-character
    whitespace check on each name) and each append as much again to build them; ``parse_header_lines`` and
    ``header_block`` do the common case in one regex pass and hand everything else to nats-py.

    ``direct`` maps a subscription's id to a function that takes its messages raw, synchronously, in the
    order they arrive, instead of nats-py building a ``Msg`` and queueing it for a task: what the log's
    follow reads (``feeds.DirectFeed``) with its own consumer protocol. The connection's parser
    (``wire.DirectParser``) hands them over as it walks the bytes read."""

    def __init__(self) -> None:
        super().__init__()
        self.direct: dict[int, DirectHandler] = {}
        self._ps = DirectParser(self)
        #: how long a read that emptied the socket waits before the next (``pacing``; 0 by default)
        self.pacing = ReadPacing()
        #: requests and their replies (``replymux``)
        self.replies = ReplyMux(self, self.subscribe_raw)

    def awaiting_reply(self) -> bool:
        """Whether anything on this connection waits for the server's answer (a request's reply, a PONG)."""
        return bool(self._resp_map) or bool(self._pongs)

    async def request(self, *args: Any, **kwargs: Any) -> Msg:
        self.pacing.interrupt()  # its reply must not wait out a pause
        return await super().request(*args, **kwargs)

    async def _request_new_style(
        self, subject: str, payload: bytes, timeout: float = 1, headers: dict[str, Any] | None = None
    ) -> Msg:
        return await self.replies.request(subject, payload, timeout, headers)

    async def subscribe_raw(self, subject: str, handler: DirectHandler) -> Subscription:
        """Subscribe with ``handler`` taking each message as it is parsed (``direct``)."""
        sub = await self.subscribe(subject)
        self.direct[sub._id] = handler
        return sub

    async def flush(self, *args: Any, **kwargs: Any) -> None:
        self.pacing.interrupt()
        await super().flush(*args, **kwargs)

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        # nats-py 2.16 writes the PING straight to the socket, ahead of the commands still queued for its
        # flusher task: the server could answer the PONG of a flush() before it saw a SUBscribe or PUBlish
        # made just before, so "subscribe, flush, then tell a publisher" lost messages (0 of 100, ~4 % of
        # tries on a busy machine, with nats-py's own client on both ends). What is queued goes first.
        if self._pending_data_size > 0 and self._transport is not None and self.is_connected:
            self._transport.writelines(self._pending[:])
            self._pending = []
            self._pending_data_size = 0
        await super()._send_ping(future)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        # nats-py's parser passes None for a message without headers, although it annotates bytes.
        handler = self.direct.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        handler(subject, reply, data, headers)

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        assert _NATS_PARSE is not None  # CLIENT_CLASS is this class only when it is there
        return parse_header_lines(raw, _NATS_PARSE)

    async def _process_headers(self, headers: bytes | None) -> dict[str, str] | None:
        # A message's headers with no inline status (``NATS/1.0\r\n`` then the lines) and a canonical block:
        # nats-py would slice twice and parse the lines with ``_parse_header_lines``, giving these. Anything
        # else (status lines, heartbeats, other blocks) is nats-py's own path.
        if headers and len(headers) > _FIRST_LINE and headers[_STATUS_AT:_FIRST_LINE] == b"\r\n":
            fields = _canonical_fields(headers[_FIRST_LINE:])
            if fields is not None:
                return fields or None
        return await super()._process_headers(headers)

    async def _send_publish(
        self, subject: str, reply: str, payload: bytes, payload_size: int, headers: dict[str, Any] | None
    ) -> None:
        block = header_block(headers) if headers and subject else None
        if block is None:
            await super()._send_publish(subject, reply, payload, payload_size, headers)
            return
        # What nats-py's _send_publish does after building the block (nats-py 2.16).
        command = nats_command.hpub_cmd(subject, reply, block, payload)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        await self._send_command(command)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()


async def subscribe_direct(nc: Client, subject: str, handler: Callable[[bytes, bytes], None]) -> Subscription:
    """Subscribe to ``subject``, ``handler(subject, payload)`` called for each message as the connection
    parses it (``FastHeadersClient.direct``): no ``Msg``, queue or task switch per message, for subjects
    heard thousands of times a second (the heartbeats). A client of another class calls it from an
    ordinary callback subscription."""
    if isinstance(nc, FastHeadersClient):
        return await nc.subscribe_raw(subject, lambda subject, _reply, data, _headers: handler(subject, data))

    async def callback(msg: Msg) -> None:
        handler(msg.subject.encode(), msg.data)

    return await nc.subscribe(subject, cb=callback)


#: The client class every connection uses: the fast one unless this nats-py lacks what it relies on.
CLIENT_CLASS: type[Client] = FastHeadersClient if _nats_internals_present() else Client
