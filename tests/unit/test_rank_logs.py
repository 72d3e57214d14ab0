"""The agent's ``logs`` verb reads bounded chunks of a rank's log; `rally` parses the times it is given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rallypoint.agent.logs import read_log_chunk
from rallypoint.agent.workdir import attempt_dir
from rallypoint.cli.account_cmds import parse_time
from rallypoint.protocol import LogsRequest


def write_log(work: Path, data: bytes) -> None:
    directory = attempt_dir(work, "j1", 2)
    directory.mkdir(parents=True)
    (directory / "rank-1.log").write_bytes(data)


def test_chunks_follow_offsets_and_never_split_a_character(tmp_path: Path) -> None:
    data = "héllo\nwörld\n".encode()
    write_log(tmp_path, data)
    text, offset = "", 0
    while offset < len(data):
        reply = read_log_chunk(
            tmp_path, LogsRequest(job_id="j1", attempt=2, rank=1, offset=offset, max_bytes=2)
        )
        assert reply.ok and reply.found and reply.size == len(data)
        assert reply.next_offset > offset
        text += reply.text
        offset = reply.next_offset
    assert text == "héllo\nwörld\n"


def test_a_missing_log_is_not_found_and_a_bad_id_refused(tmp_path: Path) -> None:
    reply = read_log_chunk(tmp_path, LogsRequest(job_id="j1", attempt=1, rank=0))
    assert reply.ok and not reply.found and reply.next_offset == 0
    assert not read_log_chunk(tmp_path, LogsRequest(job_id="../etc", attempt=1, rank=0)).ok
    assert not read_log_chunk(tmp_path, LogsRequest(job_id="j1", attempt=1, rank=0, offset=-1)).ok


def test_an_offset_past_the_end_reads_nothing(tmp_path: Path) -> None:
    write_log(tmp_path, b"abc")
    reply = read_log_chunk(tmp_path, LogsRequest(job_id="j1", attempt=2, rank=1, offset=10))
    assert (reply.offset, reply.next_offset, reply.text) == (3, 3, "")


def test_times_are_iso_epoch_or_a_duration_ago() -> None:
    assert parse_time("1700000000") == 1_700_000_000.0
    assert parse_time("2026-01-01T00:00:00+00:00") == 1_767_225_600.0
    assert parse_time("2h", now=lambda: 10_000.0) == 10_000.0 - 7200
    assert parse_time("now", now=lambda: 5.0) == 5.0
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("yesterday-ish")
