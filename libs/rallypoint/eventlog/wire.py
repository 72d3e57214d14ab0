"""The connection's protocol parser: nats-py's, with a fast path for the messages every service follows.

Every event of the log reaches ten followers at 12,500 nodes, so what parsing one delivery costs is paid
ten times over. nats-py's parser tries a regular expression for ``MSG`` before the one for ``HMSG`` (every
JetStream delivery has headers), deletes each message from the front of its buffer, copies the payload
twice, and awaits a coroutine per message. ``DirectParser`` walks the buffer with an index instead:
``MSG`` and ``HMSG`` control lines in the form the server writes (single spaces) are split in place, and a
message of a direct subscription (``FastHeadersClient.direct``) is handed to its function synchronously.
Every other line (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``, an unusual spacing) goes through
nats-py's own parser, one line at a time, which leaves the state this loop continues from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nats.aio.client import DEFAULT_BUFFER_SIZE
from nats.errors import ProtocolError
from nats.protocol import parser as nats_parser

if TYPE_CHECKING:
    from .connection import FastHeadersClient

_AWAITING_CONTROL_LINE: int = getattr(nats_parser, "AWAITING_CONTROL_LINE", 1)
_AWAITING_MSG_PAYLOAD: int = getattr(nats_parser, "AWAITING_MSG_PAYLOAD", 2)
_CRLF = b"\r\n"


def parser_internals_present() -> bool:
    """Whether nats-py's parser has the state this one shares with it (else the plain parser is used)."""
    probe = nats_parser.Parser(None)
    return (
        hasattr(nats_parser, "AWAITING_CONTROL_LINE")
        and hasattr(nats_parser, "AWAITING_MSG_PAYLOAD")
        and all(hasattr(probe, name) for name in ("buf", "state", "needed", "header_needed", "msg_arg"))
    )


class DirectParser(nats_parser.Parser):
    """nats-py's parser, walking complete messages by index (see the module's docstring)."""

    nc: FastHeadersClient
    _resets = 0

    def reset(self) -> None:
        # Counted: a reconnect resets the parser, maybe while a parse awaits; that parse must then not
        # put the old connection's bytes back.
        self._resets += 1
        super().reset()

    async def parse(self, data: bytes = b"") -> None:
        resets = self._resets
        view: bytes | bytearray = data
        if self.buf:
            self.buf.extend(data)
            view = self.buf
        pos, end = 0, len(view)
        try:
            while pos < end and self._resets == resets:
                if self.state == _AWAITING_MSG_PAYLOAD:
                    start, done = pos, pos + self.needed
                    if end < done + 2:
                        break
                    pos = done + 2  # past it before it is handed over, as nats-py deletes it first
                    await self._deliver(view, start, done)
                    continue
                eol = view.find(_CRLF, pos)
                if eol < 0:
                    break
                if not self._message_line(view, pos, eol):
                    # anything else, one line at a time: nats-py parses it from an empty buffer
                    self.buf = bytearray()
                    await super().parse(bytes(view[pos : eol + 2]))
                pos = eol + 2
        finally:
            if self._resets == resets:
                self.buf = bytearray(view[pos:])
        # nats-py's read loop reads at most DEFAULT_BUFFER_SIZE bytes: less means the socket was emptied
        await self.nc.pacing.after_read(len(data), DEFAULT_BUFFER_SIZE, self.nc.awaiting_reply)

    def _message_line(self, view: bytes | bytearray, start: int, eol: int) -> bool:
        """Take a ``MSG``/``HMSG`` control line as the server writes it; False for any other line."""
        if view.startswith(b"HMSG ", start):
            parts = view[start + 5 : eol].split(b" ")
            if len(parts) == 5:
                subject, sid, reply, header_size, size = parts
            elif len(parts) == 4:
                subject, sid, header_size, size = parts
                reply = b""
            else:
                return False
        elif view.startswith(b"MSG ", start):
            parts = view[start + 4 : eol].split(b" ")
            if len(parts) == 4:
                subject, sid, reply, size = parts
            elif len(parts) == 3:
                subject, sid, size = parts
                reply = b""
            else:
                return False
            header_size = b"0"
        else:
            return False
        if not (subject and sid.isdigit() and header_size.isdigit() and size.isdigit()):
            return False
        self.msg_arg = {"subject": bytes(subject), "sid": int(sid), "reply": bytes(reply)}
        self.header_needed = int(header_size)
        self.needed = int(size)
        if self.header_needed > self.needed:
            raise ProtocolError("nats: malformed MSG")
        self.state = _AWAITING_MSG_PAYLOAD
        return True

    async def _deliver(self, view: bytes | bytearray, start: int, done: int) -> None:
        """The payload at ``view[start:done]`` (headers first) completes the message of ``msg_arg``."""
        args: dict[str, Any] = self.msg_arg
        headers = self.header_needed
        if headers:
            block: bytes | None = bytes(view[start : start + headers])
            payload = bytes(view[start + headers : done])
        else:
            block = None
            payload = bytes(view[start:done])
        self.header_needed = 0
        self.state = _AWAITING_CONTROL_LINE
        sid = args["sid"]
        handler = self.nc.direct.get(sid)
        if handler is None:
            await self.nc._process_msg(sid, args["subject"], args["reply"], payload, block)  # type: ignore[arg-type]
            return
        stats = self.nc.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(payload)
        handler(args["subject"], args["reply"], payload, block)
