"""`rally bench binds` runs the live scheduler loop end to end on its own embedded server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("admit", [[], ["--admit-in-cycle"]])
def test_the_binds_bench_binds_every_gang_that_fits(admit: list[str]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rallypoint.cli.main",
            "bench",
            "binds",
            "--nodes",
            "20",
            "--pending",
            "30",
            "--json",
            *admit,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(result.stdout)
    # 15 one-GPU and 15 eight-GPU gangs on 160 GPUs: 15 x 8 + 15 = 135 GPUs, all fit. Unadmitted, they are
    # admitted by their binds (a job bound by the cycle that first sees it gets no JobQueued); the one cycle
    # writes its 30 binds as one GangsBound, so one message either way.
    assert figures["binds"] == 30
    assert figures["binds_per_s"] > 0
    assert figures["events_written"] == 1
