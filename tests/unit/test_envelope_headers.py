"""``envelope_from_headers`` reads a message's CloudEvents attributes exactly as a plain scan of its headers
would, whatever the layout, whether or not the layout is remembered."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from rallypoint.events import codec
from rallypoint.events.codec import envelope_from_headers


def _scan(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The definition: every ``ce-*`` header, prefix dropped, in the headers' order."""
    return {k[3:]: v for k, v in (headers or {}).items() if k.startswith("ce-")}


CASES: tuple[dict[str, str] | None, ...] = (
    None,
    {},
    {"content-type": "application/json"},
    {"ce-id": "j1:s"},
    {"Nats-Msg-Id": "x", "ce-id": "j1:s"},
    {"ce-id": "a", "ce-source": "api"},
    {
        "ce-specversion": "1.0",
        "ce-id": "j1:s",
        "ce-source": "api",
        "ce-type": "io.rallypoint.JobSubmitted.v1",
        "ce-time": "2026-11-25T17:00:00Z",
        "ce-subject": "rally.job.j1",
        "content-type": "application/json",
        "Nats-Msg-Id": "j1:s",
        "ce-traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    },
    {"ce-": "empty name", "CE-id": "not ours", "ce-id": "ours"},
)


@pytest.mark.parametrize("headers", CASES)
def test_known_layouts_read_as_a_scan_reads_them(headers: dict[str, str] | None) -> None:
    for _ in range(2):  # the first read learns the layout, the second uses it
        envelope = envelope_from_headers(headers)
        assert envelope == _scan(headers) and list(envelope) == list(_scan(headers))


def test_random_layouts_read_as_a_scan_reads_them_after_the_memory_is_full() -> None:
    rng = random.Random(15)
    names = ["ce-id", "ce-type", "ce-time", "content-type", "Nats-Msg-Id", "ce-x", "x", "ce-", "Ce-id"]
    for _ in range(5000):
        headers = {rng.choice(names) + rng.choice(["", "", str(rng.randint(0, 400))]): str(rng.random())}
        for _ in range(rng.randint(0, 6)):
            headers[rng.choice(names)] = str(rng.random())
        envelope = envelope_from_headers(headers)
        assert envelope == _scan(headers) and list(envelope) == list(_scan(headers)), headers
    assert (
        len(codec._ENVELOPE_LAYOUTS) == codec.MAX_ENVELOPE_LAYOUTS
    )  # layouts beyond it were read unremembered


@pytest.mark.parametrize("headers", [h for h in CASES if h])
def test_a_lazy_envelope_reads_as_the_parsed_headers_and_only_when_read(headers: dict[str, str]) -> None:
    from rallypoint.eventlog.feeds import Delivery, LazyEnvelope

    # the raw block as the connection hands it over: after NATS/1.0
    raw = ("\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n").encode()
    lazy = LazyEnvelope(raw)
    assert lazy._fields is None, "nothing parsed before a read"
    assert lazy == _scan(headers) and dict(lazy) == _scan(headers) and len(lazy) == len(_scan(headers))
    assert lazy.get("id") == _scan(headers).get("id")
    assert lazy._fields is not None and lazy._raw is None, "parsed once, the raw block let go"
    assert Delivery(1, "rally.job.j1", b"{}", None, raw).header_fields() == headers


def test_a_lazy_envelope_of_a_message_without_headers_is_empty() -> None:
    from rallypoint.eventlog.feeds import LazyEnvelope

    assert dict(LazyEnvelope(b"")) == {} and LazyEnvelope(None) == {}
