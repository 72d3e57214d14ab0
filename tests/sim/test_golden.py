"""Fidelity: the real core's fifo reproduces, job by job, two peer simulators on the golden Philly slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.sim.run import run_policy
from rallypoint.traces.golden import golden_cluster, golden_jobs, golden_rows


@pytest.mark.parametrize(("gpus", "avg_jct", "avg_queue"), [(64, 11043.0, 6417.0), (32, 25203.2, 20577.2)])
def test_fifo_matches_every_golden_row(
    shared_traces: Path, gpus: int, avg_jct: float, avg_queue: float
) -> None:
    res = run_policy(golden_jobs(shared_traces), golden_cluster(gpus), None, "fifo")
    got = {r.id: r for r in res.records}
    rows = golden_rows(shared_traces, gpus)
    assert len(got) == len(rows) == 1694
    wrong = [
        (g.row, g.start, g.end, got[f"{g.row:05d}"].start, got[f"{g.row:05d}"].end)
        for g in rows
        if (got[f"{g.row:05d}"].start, got[f"{g.row:05d}"].end) != (g.start, g.end)
    ]
    assert not wrong, (
        f"{len(wrong)} rows differ, first (row, want start, want end, got start, got end): {wrong[:5]}"
    )
    s = res.summary
    assert round(s["jct"]["avg"], 1) == avg_jct
    assert round(s["queue"]["avg"], 1) == avg_queue
    assert s["makespan"] == 613_890
