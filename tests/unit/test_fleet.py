"""The fleet's virtual ranks: how long a command "runs" and how it ends; racks cabled as LocalCluster's."""

from __future__ import annotations

import pytest

from rallypoint.agent.fleet import rack_of, rank_seconds


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
