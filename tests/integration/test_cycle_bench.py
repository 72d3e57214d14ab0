"""The live-cycle compute benchmark runs end to end at a small size and checks its own decisions."""

from __future__ import annotations

from rallypoint.bench.cyclebench import run_cycle_bench


def test_the_cycle_bench_decides_as_the_core_at_every_cycle() -> None:
    figures = run_cycle_bench(nodes=256, gpus_per_node=8, pending=200, cycles=3, churn=20, settle=False)
    assert figures["cycles_deciding_otherwise"] == 0
    assert figures["binds_per_cycle"] > 0
    assert figures["running_jobs"] > 0
    assert figures["live_cycle_cpu_ms_p50"] > 0 and figures["core_cycle_cpu_ms_p50"] > 0
