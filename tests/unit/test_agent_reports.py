"""The agent's reader of rank report files (``RALLY_REPORT_FILE``) on real files: complete lines only,
bad lines skipped, offsets saved so a restarted agent neither re-reads commits nor loses lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rallypoint.agent import reports
from rallypoint.agent.reports import Progress, ReportBatch, ReportSource, ReportTail


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source(tmp_path: Path, job_id: str = "job-a", attempt: int = 2, rank: int = 0) -> ReportSource:
    return ReportSource(
        job_id, attempt, rank, tmp_path / f"rank-{rank}.report", tmp_path / f"rank-{rank}.report-offset"
    )


def ckpt_line(step: int, **override: Any) -> dict[str, Any]:
    line = {
        "kind": "checkpoint",
        "job_id": "job-a",
        "attempt": 2,
        "rank": 0,
        "step": step,
        "path": f"/ckpt/job-a/step-{step:08d}",
        "manifest_sha256": "ab" * 32,
        "bytes": 4096,
        "shards": 4,
        "save_s": 1.5,
        "at": 1700000000.0 + step,
    }
    return line | override


def step_line(step: int, **override: Any) -> dict[str, Any]:
    line = {"kind": "step", "job_id": "job-a", "attempt": 2, "rank": 0, "step": step, "step_time_s": 0.25}
    return line | {"at": 1700000000.0 + step} | override


def append(path: Path, data: bytes | dict[str, Any]) -> None:
    with open(path, "ab") as handle:
        handle.write(data if isinstance(data, bytes) else json.dumps(data).encode() + b"\n")


def consume(tail: ReportTail, src: ReportSource) -> ReportBatch:
    """What the agent does each pass: read, (append the commits), advance."""
    batch = tail.read(src)
    tail.advance(batch)
    return batch


def test_only_complete_lines_are_consumed_and_a_partial_one_is_read_once_completed(tmp_path: Path) -> None:
    src = source(tmp_path)
    tail = ReportTail("node-1")
    assert consume(tail, src) == ReportBatch(src, 0, 0)  # no file yet: nothing, no error
    append(src.path, step_line(1))
    append(src.path, ckpt_line(10))
    whole = json.dumps(ckpt_line(20)).encode() + b"\n"
    append(src.path, whole[:37])  # the rank is mid-write
    batch = consume(tail, src)
    assert [c.step for c in batch.commits] == [10]
    # every field of the line but the kind and the rank, plus the node that reported it
    expected = {k: v for k, v in ckpt_line(10).items() if k not in ("kind", "rank")} | {"node_id": "node-1"}
    assert msgspec.to_builtins(batch.commits[0]) == expected | {"type": "CheckpointCommitted.v1"}
    assert tail.progress[src.key] == Progress(step=1, step_time_s=0.25, at=1700000001.0)
    assert consume(tail, src).commits == ()  # still partial: nothing, and nothing skipped
    append(src.path, whole[37:])
    append(src.path, step_line(21))
    append(src.path, step_line(22, step_time_s=0.5))
    batch = consume(tail, src)
    assert [c.step for c in batch.commits] == [20]
    assert tail.progress[src.key] == Progress(step=22, step_time_s=0.5, at=1700000022.0)  # the latest
    assert batch.end == src.path.stat().st_size


def test_reading_twice_before_advancing_gives_the_same_lines(tmp_path: Path) -> None:
    # Two-phase: a batch whose appends did not finish (agent stopped) is read again, never skipped.
    src = source(tmp_path)
    tail = ReportTail("node-1")
    append(src.path, ckpt_line(10))
    first = tail.read(src)
    assert tail.read(src) == first
    tail.advance(first)
    tail.advance(first)  # stale: ignored
    assert tail.read(src).commits == ()


def test_bad_lines_are_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = source(tmp_path)
    tail = ReportTail("node-1")
    for bad in (
        b"{not json\n",
        b"[1, 2]\n",
        json.dumps(ckpt_line(5, job_id="job-other")).encode() + b"\n",  # not this rank's job
        json.dumps(ckpt_line(6, attempt=1)).encode() + b"\n",  # an older attempt's line
        json.dumps(ckpt_line(7, rank=3)).encode() + b"\n",
        json.dumps(ckpt_line(8) | {"step": "eight"}).encode() + b"\n",
        json.dumps({k: v for k, v in ckpt_line(9).items() if k != "manifest_sha256"}).encode() + b"\n",
        json.dumps(step_line(3, step_time_s=None)).encode() + b"\n",
        json.dumps(step_line(4, kind="mystery")).encode() + b"\n",
        b"\n",
    ):
        append(src.path, bad)
    append(src.path, ckpt_line(11))
    with caplog.at_level(logging.WARNING, logger="rallypoint.agent.reports"):
        batch = consume(tail, src)
    assert [c.step for c in batch.commits] == [11]
    assert src.key not in tail.progress
    skipped = [r for r in caplog.records if "skipping a report line" in r.getMessage()]
    assert len(skipped) == 10


def test_the_offset_and_progress_survive_a_restart(tmp_path: Path) -> None:
    src = source(tmp_path)
    clock = Clock()
    tail = ReportTail("node-1", clock=clock)
    append(src.path, step_line(1))
    append(src.path, ckpt_line(10))
    consume(tail, src)
    saved = json.loads(src.offset_path.read_text())
    assert saved["offset"] == src.path.stat().st_size  # saved at once after a commit
    assert saved["progress"] == {"step": 1, "step_time_s": 0.25, "at": 1700000001.0}

    append(src.path, step_line(11))
    consume(tail, src)
    # progress alone is saved at most every OFFSET_SAVE_INTERVAL_S
    assert json.loads(src.offset_path.read_text())["offset"] == saved["offset"]
    clock.now += reports.OFFSET_SAVE_INTERVAL_S
    append(src.path, step_line(12))
    consume(tail, src)
    assert json.loads(src.offset_path.read_text())["offset"] == src.path.stat().st_size

    append(src.path, ckpt_line(20))  # written while the agent is down
    restarted = ReportTail("node-1", clock=clock)
    restarted.read(src)  # loads the saved state
    assert restarted.progress[src.key].step == 12  # known before any new step line
    assert [c.step for c in consume(restarted, src).commits] == [20]  # 10 is not read again


def test_a_replaced_report_file_is_read_from_the_start(tmp_path: Path) -> None:
    src = source(tmp_path)
    append(src.path, ckpt_line(10))
    append(src.path, ckpt_line(11))
    consume(ReportTail("node-1"), src)
    src.path.unlink()
    append(src.path, ckpt_line(12))
    assert [c.step for c in consume(ReportTail("node-1"), src).commits] == [12]


def test_an_overlong_line_is_dropped_and_the_next_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reports, "MAX_LINE_BYTES", 400)
    src = source(tmp_path)
    tail = ReportTail("node-1")
    append(src.path, b"x" * 1000)
    assert consume(tail, src).discarding
    append(src.path, b"y" * 500 + b"\n")
    append(src.path, ckpt_line(10))
    commits = [c.step for _ in range(5) for c in consume(tail, src).commits]
    assert commits == [10]
    assert tail.read(src).end == src.path.stat().st_size


def test_retain_forgets_ranks_no_longer_tailed(tmp_path: Path) -> None:
    first, second = source(tmp_path, rank=0), source(tmp_path, rank=1)
    tail = ReportTail("node-1")
    append(first.path, step_line(1))
    append(second.path, step_line(1, rank=1))
    consume(tail, first)
    consume(tail, second)
    tail.retain([second])
    assert list(tail.progress) == [second.key]
