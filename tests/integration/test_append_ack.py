"""An append reads the server's answer itself (``EventLog._js_publish``: msgspec, not nats-py's json and
dataclass): on a real server, every kind of answer gives what ``JetStreamContext.publish`` gives, or raises
what it raises."""

from __future__ import annotations

from typing import Any

import nats.js.errors

from rallypoint.eventlog import EventLog
from rallypoint.eventlog.log import EXPECTED_SUBJECT_SEQ, MSG_ID


async def _both(log: EventLog, subject: str, headers: dict[str, str], stream: str | None = None) -> list[Any]:
    """(seq, duplicate) or (exception type, err_code, description) from ours, then from nats-py's."""
    answers: list[Any] = []
    for publish in ("ours", "nats-py"):
        try:
            if publish == "ours":
                ours = EventLog(log.nc, stream=stream or log.stream)
                answers.append(await ours._js_publish(subject, b"{}", dict(headers)))
            else:
                ack = await log.js.publish(subject, b"{}", headers=dict(headers), stream=stream or log.stream)
                answers.append((ack.seq, bool(ack.duplicate)))
        except nats.js.errors.Error as exc:
            answers.append((type(exc), getattr(exc, "err_code", None), getattr(exc, "description", None)))
    return answers


async def test_a_new_message_then_its_retry_read_as_nats_py_reads_them(event_log: EventLog) -> None:
    first = await event_log._js_publish("rally.job.j1", b"{}", {MSG_ID: "once"})
    assert first == (1, False)
    ours, theirs = await _both(event_log, "rally.job.j1", {MSG_ID: "once"})
    assert ours == theirs == (1, True)
    ours, theirs = await _both(event_log, "rally.job.j1", {})
    assert ours == (2, False) and theirs == (3, False)  # two appends, one after the other


async def test_refusals_raise_what_nats_py_raises(event_log: EventLog) -> None:
    await event_log._js_publish("rally.job.j1", b"{}", {MSG_ID: "a"})
    ours, theirs = await _both(event_log, "rally.job.j1", {EXPECTED_SUBJECT_SEQ: "7"})  # a failed guard
    assert ours == theirs and ours[0] is nats.js.errors.BadRequestError and ours[1] == 10071
    ours, theirs = await _both(event_log, "rally.job.j1", {}, stream="ELSEWHERE")  # not the stream expected
    assert ours == theirs and issubclass(ours[0], nats.js.errors.APIError) and ours[1] == 10060


async def test_a_subject_no_stream_stores_raises_what_nats_py_raises(event_log: EventLog) -> None:
    ours, theirs = await _both(event_log, "nobody.stores.this", {})
    assert ours == theirs and ours[0] is nats.js.errors.NoStreamResponseError
