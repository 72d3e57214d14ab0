"""Quarantine in the codec and the fold: no stored message can stop a fold, and every fold skips alike.

Given bytes as they may sit in the log (junk, a newer version, an unknown type, a broken body), the codec
answers a ``Quarantined`` record naming the reason; the fold keeps it, so two folds of one log agree on
the state hash, a snapshot carries it, and `rally replay`'s history files round-trip it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import export_history, fold, load_history, quarantine_lines, summarize
from rallypoint.events import JobQueued, JobSpec, JobSubmitted, encode, subjects
from rallypoint.events.codec import (
    KEPT_QUARANTINE_RECORDS,
    MAX_QUARANTINE_TEXT,
    UPCASTERS,
    Quarantined,
    QuarantineLog,
    UnreadableEvent,
    decode,
    decode_stored,
)
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

SUBJECT = "rally.job.x"
SPEC = JobSpec(name="p", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("python",))
V2 = b'{"type":"JobSubmitted.v2","job_id":"j-v2","spec":{},"submitted_at":1.0,"priority_band":3}'

# (case, stored bytes, reason, event type the record names)
POISON: list[tuple[str, bytes, str, str]] = [
    ("junk", b"\x00junk", "undecodable", ""),
    ("empty", b"", "undecodable", ""),
    ("json but not an object", b"[1, 2]", "undecodable", ""),
    ("type is not a string", b'{"type": 5}', "undecodable", ""),
    ("no type", b'{"job_id": "x"}', "undecodable", ""),
    ("3,000 levels deep", b"[" * 3000 + b"]" * 3000, "undecodable", ""),
    (
        "deep inside an event",
        b'{"type":"JobQueued.v1","x":' + b"[" * 3000 + b"]" * 3000 + b"}",
        "undecodable",
        "",
    ),
    ("newer version of a known event", V2, "newer-version", "JobSubmitted.v2"),
    ("unknown event", b'{"type": "Nope.v9"}', "unknown-type", "Nope.v9"),
    ("untagged name", b'{"type": "JobSubmitted"}', "unknown-type", "JobSubmitted"),
    ("older version without an upcaster", b'{"type": "JobQueued.v0"}', "unknown-type", "JobQueued.v0"),
    ("known type, broken body", b'{"type": "JobQueued.v1", "job_id": 7}', "invalid", "JobQueued.v1"),
    (
        "known type, unknown field",
        b'{"type": "JobQueued.v1", "job_id": "j", "queue": "q", "x": 1}',
        "invalid",
        "JobQueued.v1",
    ),
]


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=SPEC, submitted_at=1.0)


@pytest.mark.parametrize(("case", "data", "reason", "tag"), POISON, ids=[c[0] for c in POISON])
def test_what_cannot_be_read_is_quarantined_with_its_reason(
    case: str, data: bytes, reason: str, tag: str
) -> None:
    record = decode_stored(data, seq=7, subject=SUBJECT)
    assert isinstance(record, Quarantined)
    assert (record.seq, record.subject, record.reason, record.event_type) == (7, SUBJECT, reason, tag)
    assert record.error
    assert "seq 7" in record.describe() and reason in record.describe()
    with pytest.raises(UnreadableEvent) as caught:
        decode(data)
    assert isinstance(caught.value, msgspec.DecodeError)  # callers catching msgspec's errors still do


def test_a_good_event_decodes_as_before() -> None:
    event = submitted("j-1")
    assert decode_stored(encode(event), seq=1, subject=subjects.job("j-1")) == event


def test_a_hostile_tag_or_error_cannot_grow_the_state() -> None:
    record = decode_stored(b'{"type": "' + b"A" * 100_000 + b'.v1"}', seq=1, subject=SUBJECT)
    assert isinstance(record, Quarantined)
    assert len(record.event_type) <= MAX_QUARANTINE_TEXT and len(record.error) <= MAX_QUARANTINE_TEXT


# --- upcasters ---------------------------------------------------------------------------------------


def _queued_v0_to_v1(body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "JobQueued.v1", "job_id": body["id"], "queue": body["q"], "at": body["t"]}


def test_a_known_older_version_is_upcast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UPCASTERS, "JobQueued.v0", _queued_v0_to_v1)
    assert decode(b'{"type": "JobQueued.v0", "id": "j", "q": "nlp", "t": 2.0}') == JobQueued(
        job_id="j", queue="nlp", at=2.0
    )


def test_upcasters_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UPCASTERS, "JobQueued.v0", _queued_v0_to_v1)
    monkeypatch.setitem(UPCASTERS, "JobQueued.vminus", lambda body: {**body, "type": "JobQueued.v0"})
    event = decode(b'{"type": "JobQueued.vminus", "id": "j", "q": "nlp", "t": 2.0}')
    assert event == JobQueued(job_id="j", queue="nlp", at=2.0)


def test_an_upcaster_that_fails_quarantines_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UPCASTERS, "JobQueued.v0", _queued_v0_to_v1)
    record = decode_stored(b'{"type": "JobQueued.v0"}', seq=3, subject=SUBJECT)  # no "id": KeyError inside
    assert isinstance(record, Quarantined) and record.reason == "invalid"
    assert record.event_type == "JobQueued.v0"


def test_an_upcaster_loop_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UPCASTERS, "JobQueued.v0", lambda body: {**body, "type": "JobQueued.vz"})
    monkeypatch.setitem(UPCASTERS, "JobQueued.vz", lambda body: {**body, "type": "JobQueued.v0"})
    record = decode_stored(b'{"type": "JobQueued.v0"}', seq=3, subject=SUBJECT)
    assert isinstance(record, Quarantined) and record.reason == "invalid"


# --- the fold keeps what it skipped ------------------------------------------------------------------


def poisoned_history() -> list[tuple[int, Any]]:
    """A job, junk, a newer version, another job: what the issue's live cluster had in its log."""
    return [
        (1, submitted("j-1")),
        (2, decode_stored(b"\x00junk", seq=2, subject=SUBJECT)),
        (3, decode_stored(V2, seq=3, subject=SUBJECT)),
        (4, submitted("j-2")),
    ]


def test_the_fold_goes_on_past_poison_and_keeps_it() -> None:
    state = fold(poisoned_history())
    assert set(state.jobs) == {"j-1", "j-2"}
    assert state.last_seq == 4
    log = state.quarantine
    assert log.total == 2 and [r.seq for r in log.records] == [2, 3]
    assert log.by_reason == {"undecodable": 1, "newer-version": 1}
    assert log.newer == {"JobSubmitted.v2": 3}


def test_every_fold_of_one_log_gets_one_hash_and_the_quarantine_is_part_of_it() -> None:
    assert fold(poisoned_history()).hash() == fold(poisoned_history()).hash()
    clean = [(seq, e) for seq, e in poisoned_history() if not isinstance(e, Quarantined)]
    assert fold(clean).hash() != fold(poisoned_history()).hash()


def test_poison_as_the_last_message_still_moves_the_fold_to_it() -> None:
    state = fold(poisoned_history()[:3])
    assert state.last_seq == 3


def test_a_snapshot_keeps_the_quarantine() -> None:
    state = fold(poisoned_history())
    restored = ClusterState.decode(state.encode())
    assert restored.quarantine == state.quarantine and restored.hash() == state.hash()


def test_newer_versions_say_what_to_upgrade_for() -> None:
    lines = fold(poisoned_history()).quarantine.newer_versions()
    assert len(lines) == 1
    assert "JobSubmitted.v2" in lines[0] and "seq 3" in lines[0] and "JobSubmitted.v1" in lines[0]


def test_the_quarantine_keeps_a_bounded_number_of_records() -> None:
    log = QuarantineLog()
    for seq in range(1, KEPT_QUARANTINE_RECORDS + 51):
        log.add(Quarantined(seq=seq, subject=SUBJECT, event_type="", reason="undecodable", error="x"))
    assert log.total == KEPT_QUARANTINE_RECORDS + 50
    assert len(log.records) == KEPT_QUARANTINE_RECORDS and log.records[0].seq == 1


# --- rally replay: summary, export, history files, the audit -----------------------------------------


def test_the_summary_lists_the_quarantined_sequences() -> None:
    summary = summarize(fold(poisoned_history()))
    assert summary["quarantined_total"] == 2
    assert [r["seq"] for r in summary["quarantined"]] == [2, 3]  # type: ignore[attr-defined]
    text = "\n".join(quarantine_lines(summary))
    assert "seq 2 on rally.job.x" in text and "seq 3 on rally.job.x" in text and "newer-version" in text


def test_an_export_round_trips_the_quarantine_records(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    assert export_history(poisoned_history(), str(path)) == 4
    lines = path.read_text().splitlines()
    assert '"quarantined"' in lines[1] and '"quarantined"' in lines[2]
    loaded = load_history(str(path))
    assert loaded == poisoned_history()
    assert fold(loaded).hash() == fold(poisoned_history()).hash()


def test_a_history_with_an_event_this_version_does_not_know_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "newer.jsonl"
    path.write_text(
        '{"seq": 1, "event": {"type": "JobQueued.v1", "job_id": "j", "queue": "q", "at": 1.0}}\n'
        f'{{"seq": 2, "event": {V2.decode()}}}\n'
    )
    loaded = load_history(str(path))
    assert loaded[0] == (1, JobQueued(job_id="j", queue="q", at=1.0))
    seq, record = loaded[1]
    assert seq == 2 and isinstance(record, Quarantined) and record.reason == "newer-version"


def test_the_audit_skips_and_lists_the_quarantined_sequences() -> None:
    report = verify_decisions(poisoned_history(), SchedulingPolicy("rallypoint"))
    assert report.ok and report.quarantined == [2, 3]
    assert report.final_hash == fold(poisoned_history()).hash()
