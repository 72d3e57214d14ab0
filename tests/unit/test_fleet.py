"""The fleet's virtual ranks: how long a command "runs" and how it ends; racks cabled as LocalCluster's;
a starved fleet saying its heartbeats fell behind schedule."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rallypoint.agent.fleet import Fleet, rack_of, rank_seconds


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["sleep", "5"], (5.0, 0)),
        (["/bin/sleep", "0.5"], (0.5, 0)),
        (["true"], (0.0, 0)),
        (["false"], (0.0, 1)),
        (["python", "train.py"], (None, 0)),  # runs until killed
        (["sleep", "soon"], (None, 0)),
        ([], (None, 0)),
    ],
)
def test_a_virtual_rank_runs_as_its_command_says(
    command: list[str], expected: tuple[float | None, int]
) -> None:
    assert rank_seconds(command) == expected


def test_racks_are_contiguous_blocks() -> None:
    assert [rack_of(i, 4, 2) for i in range(4)] == ["rack-1", "rack-1", "rack-2", "rack-2"]
    assert rack_of(12_499, 12_500, 390) == "rack-390"


def test_a_round_of_heartbeats_far_past_its_interval_is_counted_and_said_once_in_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: Any = None  # the rounds' bookkeeping touches no connection
    fleet = Fleet(log, [], heartbeat_interval_s=1.0)
    with caplog.at_level(logging.WARNING, logger="rallypoint.fleet"):
        fleet._note_round(1.4)  # within 1.5 intervals: on schedule
        assert fleet.late_rounds == 0 and not caplog.records
        fleet._note_round(2.5)
        fleet._note_round(3.0)  # late again within 10 s: counted, not said again
    assert fleet.late_rounds == 2
    (warning,) = caplog.records
    assert "heartbeats behind schedule" in warning.getMessage() and "took 2.5 s" in warning.getMessage()
