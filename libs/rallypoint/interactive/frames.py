"""The frames of a terminal session, the same on every hop: one type byte, then the payload.

On a message transport (a WebSocket message, a NATS message) a frame is the whole message. On a byte
stream (the Unix socket between the agent and the rank wrapper) each frame is prefixed with its payload's
length (``encode_stream``, ``StreamDecoder``).

Types, and who sends them:

- ``DATA`` (``d``): terminal bytes; keystrokes towards the rank, output from it.
- ``RESIZE`` (``r``): the user's window, rows and columns, two unsigned 16-bit integers (big-endian).
- ``EXIT`` (``x``): the rank has exited; its exit status, a signed 32-bit integer (big-endian).
- ``CLOSED`` (``c``): the other side ended the session; the payload says why (UTF-8): a second attach
  took the terminal, an idle timeout, an agent or API going away.
- ``PING`` (``p``): the API tells the agent that the session still has a client (keepalive, no payload).

Standard library only: the rank wrapper imports it, and should start fast.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

DATA = b"d"
RESIZE = b"r"
EXIT = b"x"
CLOSED = b"c"
PING = b"p"
TYPES = frozenset({DATA, RESIZE, EXIT, CLOSED, PING})
#: The most a frame's payload may hold: a pty read or a paste, never a whole file.
MAX_PAYLOAD = 1 << 20

_SIZE = struct.Struct(">HH")
_STATUS = struct.Struct(">i")
_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """Bytes that are no frame: unknown type, a payload of the wrong size, or too long."""


class Frame(NamedTuple):
    kind: bytes
    payload: bytes = b""


def data(payload: bytes) -> bytes:
    return DATA + payload


def resize(rows: int, cols: int) -> bytes:
    """A window of ``rows`` x ``cols`` (each clamped to 1-65535: a terminal of 0 rows is none)."""
    return RESIZE + _SIZE.pack(_clamp(rows), _clamp(cols))


def exited(status: int) -> bytes:
    return EXIT + _STATUS.pack(status)


def closed(reason: str) -> bytes:
    return CLOSED + reason.encode("utf-8", "replace")


def ping() -> bytes:
    return PING


def decode(message: bytes) -> Frame:
    """One whole message as a frame; ``FrameError`` when it is none."""
    if not message:
        raise FrameError("empty frame")
    kind, payload = message[:1], bytes(message[1:])
    if kind not in TYPES:
        raise FrameError(f"unknown frame type {kind!r}")
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"frame of {len(payload)} bytes; at most {MAX_PAYLOAD}")
    if kind == RESIZE and len(payload) != _SIZE.size:
        raise FrameError(f"a resize frame holds {_SIZE.size} bytes, not {len(payload)}")
    if kind == EXIT and len(payload) != _STATUS.size:
        raise FrameError(f"an exit frame holds {_STATUS.size} bytes, not {len(payload)}")
    return Frame(kind, payload)


def window(frame: Frame) -> tuple[int, int]:
    """A resize frame's rows and columns."""
    rows, cols = _SIZE.unpack(frame.payload)
    return rows, cols


def status(frame: Frame) -> int:
    """An exit frame's exit status."""
    return int(_STATUS.unpack(frame.payload)[0])


def reason(frame: Frame) -> str:
    return frame.payload.decode("utf-8", "replace")


def encode_stream(message: bytes) -> bytes:
    """A frame (``data(...)``, ``resize(...)``, ...) as it travels on a byte stream: type, length, payload."""
    return message[:1] + _LENGTH.pack(len(message) - 1) + message[1:]


class StreamDecoder:
    """Frames out of a byte stream, however the stream cut them: ``feed`` bytes, get the whole frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[Frame]:
        self._buffer += chunk
        frames: list[Frame] = []
        header = 1 + _LENGTH.size
        while len(self._buffer) >= header:
            (length,) = _LENGTH.unpack_from(self._buffer, 1)
            if length > MAX_PAYLOAD:
                raise FrameError(f"frame of {length} bytes; at most {MAX_PAYLOAD}")
            if len(self._buffer) < header + length:
                break
            message = bytes(self._buffer[:1]) + bytes(self._buffer[header : header + length])
            del self._buffer[: header + length]
            frames.append(decode(message))
        return frames


def _clamp(value: int) -> int:
    return max(1, min(int(value), 0xFFFF))
