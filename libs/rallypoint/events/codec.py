"""Encoding events to bytes and back, and the CloudEvents envelope that rides in NATS headers.

Decoding is where a log written by another version (or by nobody we know) meets this one, so it never
lets one stored message stop a fold:

- a known older version is upcast to the current one (``UPCASTERS``: old tag -> next version's body);
- anything else becomes a ``Quarantined`` record (``decode_stored``) saying why it cannot be folded:
  not JSON / not an event (``undecodable``), a type nobody defined (``unknown-type``), a newer version
  of an event this code knows (``newer-version``, what a rolling upgrade writes), or a known type whose
  body does not match it (``invalid``), or an event stored on a subject its type and ids do not give
  (``misplaced``: written by someone the permissions should have stopped; ``subjects.admissible``). Every
  fold keeps these in its state (``QuarantineLog``), so every
  service and every replay skip the same messages and still agree on the state hash.
"""

from __future__ import annotations

import datetime as _dt
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from . import subjects
from .catalogue import ALL_EVENT_TYPES, Event

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"

QuarantineReason = Literal["undecodable", "unknown-type", "newer-version", "invalid", "misplaced"]

#: A quarantine record keeps at most this much of the offending type tag and error text: a hostile
#: message must not be able to grow every service's state by its own size.
MAX_QUARANTINE_TEXT = 200
#: A fold keeps the first this many quarantine records (and this many newer-version tags); it counts all.
KEPT_QUARANTINE_RECORDS = 1000

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

#: Older tag -> a function turning such a body into the body of the next version, its ``type`` included.
#: Empty while every event is at v1: a breaking change adds ``.v2`` to the catalogue and an entry here for
#: ``.v1``, so that logs written before the change still fold. Chains (v1 -> v2 -> v3) are followed.
UPCASTERS: dict[str, Upcaster] = {}

_TAG = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*)\.v(?P<version>[0-9]{1,9})$")


def _split_tag(tag: str) -> tuple[str, int] | None:
    match = _TAG.match(tag)
    return (match["name"], int(match["version"])) if match else None


def _tag_of(event_type: type[Any]) -> str:
    tag = event_type.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


#: Event name -> the version this code reads (``JobSubmitted`` -> 1).
CURRENT_VERSIONS: dict[str, int] = {
    parts[0]: parts[1] for parts in (_split_tag(_tag_of(t)) for t in ALL_EVENT_TYPES) if parts is not None
}


class UnreadableEvent(msgspec.DecodeError):
    """Bytes that are not an event this code can fold; ``reason`` says which way (a QuarantineReason)."""

    def __init__(self, reason: QuarantineReason, event_type: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: QuarantineReason = reason
        self.event_type = event_type[:MAX_QUARANTINE_TEXT]
        self.detail = detail[:MAX_QUARANTINE_TEXT]


class Quarantined(msgspec.Struct, frozen=True, kw_only=True):
    """A stored message no fold of this version can apply, where it is in the log and why."""

    seq: int
    subject: str
    event_type: str  # the message's ``type`` tag when one could be read, else ""
    reason: QuarantineReason
    error: str

    def describe(self) -> str:
        what = self.event_type or "message"
        return f"seq {self.seq} on {self.subject}: {what} is {self.reason}: {self.error}"


class QuarantineLog(msgspec.Struct, kw_only=True):
    """What a fold keeps about the messages it skipped; part of the folded state, so of its hash."""

    total: int = 0
    by_reason: dict[str, int] = {}
    records: list[Quarantined] = []  # the first KEPT_QUARANTINE_RECORDS, in log order
    newer: dict[str, int] = {}  # newer-version tag -> sequence of its first occurrence

    def add(self, record: Quarantined) -> None:
        self.total += 1
        self.by_reason[record.reason] = self.by_reason.get(record.reason, 0) + 1
        if len(self.records) < KEPT_QUARANTINE_RECORDS:
            self.records.append(record)
        if record.reason == "newer-version" and len(self.newer) < KEPT_QUARANTINE_RECORDS:
            self.newer.setdefault(record.event_type, record.seq)

    def newer_versions(self) -> list[str]:
        """One line per newer event version met: a service must be upgraded to understand it."""
        lines = []
        for tag, seq in sorted(self.newer.items()):
            parts = _split_tag(tag)
            known = (
                f"{parts[0]}.v{CURRENT_VERSIONS[parts[0]]}" if parts and parts[0] in CURRENT_VERSIONS else "?"
            )
            lines.append(
                f"event {tag} (first at seq {seq}) is newer than this version reads ({known}); upgrade"
            )
        return lines


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> Event:
    """The event in ``data``, an older version upcast to the current one; else ``UnreadableEvent``."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        # The slow path runs only for messages the catalogue does not read as they are.
        return _upcast_or_explain(data, exc)


def decode_stored(data: bytes, *, seq: int, subject: str) -> Event | Quarantined:
    """``decode`` for a fold: what cannot be read comes back as a ``Quarantined`` record, never raises.

    An event on a subject it may not use is quarantined too (``misplaced``), so no fold applies what a
    writer without the right to it appended. ``subject=""`` means "not known" (an exported history keeps
    only what the live fold kept): not checked.
    """
    try:
        event = decode(data)
    except UnreadableEvent as exc:
        return Quarantined(
            seq=seq, subject=subject, event_type=exc.event_type, reason=exc.reason, error=exc.detail
        )
    if subject and not subjects.admissible(subject, event):
        return _misplaced(event, seq=seq, subject=subject)
    return event


def _misplaced(event: Event, *, seq: int, subject: str) -> Quarantined:
    tag = event_type(event)
    try:
        belongs = f"it belongs on {subjects.for_event(event)}"
    except ValueError as exc:
        belongs = f"its ids form no subject ({exc})"
    error = f"not admissible on this subject; {belongs}"
    return Quarantined(
        seq=seq,
        subject=subject[:MAX_QUARANTINE_TEXT],
        event_type=tag,
        reason="misplaced",
        error=error[:MAX_QUARANTINE_TEXT],
    )


class _TagOnly(msgspec.Struct):
    type: object = None


_tag_decoder = msgspec.json.Decoder(_TagOnly)


def _upcast_or_explain(data: bytes, exc: Exception) -> Event:
    detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
    try:
        tag = _tag_decoder.decode(data).type
    except (msgspec.DecodeError, RecursionError):
        tag = None
    if not isinstance(tag, str):
        raise UnreadableEvent("undecodable", "", detail) from exc
    if tag in UPCASTERS:
        return _upcast(data, tag)
    parts = _split_tag(tag)
    current = CURRENT_VERSIONS.get(parts[0]) if parts else None
    if parts is None or current is None:
        raise UnreadableEvent("unknown-type", tag, f"no event type {tag!r} in this version's catalogue")
    if parts[1] > current:
        raise UnreadableEvent("newer-version", tag, f"this version reads {parts[0]}.v{current}")
    if parts[1] < current:
        raise UnreadableEvent("unknown-type", tag, f"no upcaster from {tag} to {parts[0]}.v{current}")
    raise UnreadableEvent("invalid", tag, detail) from exc


def _upcast(data: bytes, tag: str) -> Event:
    old = tag
    try:
        body: Any = msgspec.json.decode(data)
        # Bounded: a table that loops (v1 -> v2 -> v1) must not hang a fold.
        for _ in range(len(UPCASTERS)):
            upcaster = UPCASTERS.get(tag)
            if upcaster is None:
                break
            body = upcaster(body)
            tag = str(body.get("type", ""))
        return msgspec.convert(body, Event)
    except Exception as exc:  # an upcaster meeting a malformed old body must not stop the fold either
        raise UnreadableEvent("invalid", old, f"upcast to {tag} failed: {exc}") from exc


def event_type(event: Event) -> str:
    return _tag_of(type(event))


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
    """The ``ce-*`` headers without their prefix, in their order: the event's CloudEvents attributes.

    Every service reads this for every event it follows, and the log's messages come in a handful of
    header layouts (which headers, in which order): the positions of a layout's ``ce-*`` headers are found
    once and picked from the values at C speed, instead of testing each header's name on each message."""
    if not headers:
        return {}
    keys = tuple(headers)
    layout = _ENVELOPE_LAYOUTS.get(keys)
    if layout is None:
        layout = _envelope_layout(keys)
        if len(_ENVELOPE_LAYOUTS) < MAX_ENVELOPE_LAYOUTS:  # bounded: headers are whatever a writer sent
            _ENVELOPE_LAYOUTS[keys] = layout
    names, pick = layout
    return dict(zip(names, pick(tuple(headers.values())), strict=False))  # equal lengths by construction


_Pick = Callable[[tuple[str, ...]], tuple[str, ...]]
#: Header layouts remembered (names in order -> the envelope's names and where their values are).
MAX_ENVELOPE_LAYOUTS = 256
_ENVELOPE_LAYOUTS: dict[tuple[str, ...], tuple[tuple[str, ...], _Pick]] = {}


def _envelope_layout(keys: tuple[str, ...]) -> tuple[tuple[str, ...], _Pick]:
    at = [i for i, key in enumerate(keys) if key.startswith("ce-")]
    names = tuple(keys[i][3:] for i in at)
    if len(at) > 1:
        return names, operator.itemgetter(*at)
    # itemgetter of one index gives the value itself, not a 1-tuple; of none it cannot be built
    return names, (lambda values: tuple(values[i] for i in at))
