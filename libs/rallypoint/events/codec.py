"""Encoding events to bytes and back, and the CloudEvents envelope that rides in NATS headers."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping

import msgspec

from .catalogue import Event

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> Event:
    return _decoder.decode(data)


def event_type(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def envelope_headers(event: Event, *, event_id: str, source: str, subject: str, at: float) -> dict[str, str]:
    """CloudEvents binary-mode attributes as ``ce-*`` headers (the HTTP binding's spelling)."""
    time = _dt.datetime.fromtimestamp(at, tz=_dt.UTC).isoformat().replace("+00:00", "Z")
    return {
        "ce-specversion": SPEC_VERSION,
        "ce-id": event_id,
        "ce-source": source,
        "ce-type": f"io.rallypoint.{event_type(event)}",
        "ce-time": time,
        "ce-subject": subject,
        "content-type": CONTENT_TYPE,
    }


def envelope_from_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    return {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
