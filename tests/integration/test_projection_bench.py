"""``python -m rallypoint.bench.projectionbench`` on a real PostgreSQL, at a tiny size."""

from __future__ import annotations

from rallypoint.bench.projectionbench import history, run
from rallypoint.state import ClusterState


def test_history_is_whole_short_lives_in_time_order() -> None:
    records = history(nodes=3, jobs=5)
    assert [r.seq for r in records] == list(range(1, 3 + 1 + 5 * 6 + 1))
    state = ClusterState()
    for r in records:
        state.apply(r.seq, r.event)
    assert sorted(job.state for job in state.jobs.values()) == ["completed"] * 5
    assert all(not node.allocated for node in state.nodes.values())  # every GPU given back


def test_bench_reports_cpu_per_job() -> None:
    out = run(nodes=3, jobs=40, batch=10)
    assert (out["jobs"], out["batch"]) == (40, 10)
    assert out["client_cpu_ms_per_job"] > 0
    assert out["postgres_cpu_ms_per_job"] >= 0
