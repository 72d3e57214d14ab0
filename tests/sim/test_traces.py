"""Trace converters on the small samples committed under tests/sim/data."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

import pytest
from gpujoins import GpuJoins

from rallypoint.sim.engine import SimOptions, Simulator
from rallypoint.sim.workload import Job, load_workload
from rallypoint.traces import load, openb, philly
from rallypoint.traces.convert import convert_openb, convert_philly


def test_philly_rows_and_origin(data_dir: Path) -> None:
    rows = philly.select(philly.read_rows(data_dir / "philly_sample.csv"))
    assert len(rows) == 200
    jobs = philly.to_jobs(rows)
    assert jobs[0].submit == 0.0
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    assert {j.team for j in jobs} == {"6214e9", "11cb48"}
    assert all(j.duration == int(j.duration) for j in jobs)


def test_philly_convert_scale_cluster_hits_load(data_dir: Path, tmp_path: Path) -> None:
    conv = convert_philly(
        data_dir / "philly_sample.csv",
        data_dir / "philly_vc.csv",
        datetime(2017, 10, 2),
        0.5,
        target_load=0.9,
    )
    g = conv.cluster.total_gpus
    assert g % 8 == 0
    assert conv.info["offered_load"] <= 0.9
    # one node fewer would exceed the target: the cluster is the smallest that meets it
    assert load.offered_load(conv.jobs, g - 8, 0.5 * 86400) > 0.9 or g == 8 * -(
        -max(j.gpus for j in conv.jobs) // 8
    )
    assert conv.queues is not None
    assert sum(t.nominal for t in conv.queues.teams) == g
    # quotas in proportion to the VC sizes (64 and 16 nodes)
    assert abs(conv.queues.nominal("6214e9") - 4 * conv.queues.nominal("11cb48")) <= 4
    assert {j.priority for j in conv.jobs} <= {"training-high", "training-standard", "best-effort"}
    assert all(j.time_limit is not None and j.time_limit >= j.duration for j in conv.jobs)
    paths = conv.write(tmp_path)
    assert load_workload(paths["workload"]) == sorted(conv.jobs, key=lambda j: j.submit)


def test_compress_arrivals_reaches_target() -> None:
    jobs = [Job(id=str(i), submit=i * 100.0, gpus=1, duration=50.0, team="t") for i in range(100)]
    out, window = load.compress_arrivals(jobs, gpus=1, window=10_000.0, target=1.0, integer_seconds=False)
    assert window == pytest.approx(5_000.0)
    assert load.offered_load(out, 1, window) == pytest.approx(1.0)
    assert [j.duration for j in out] == [j.duration for j in jobs]


def test_split_quota_largest_remainder() -> None:
    assert load.split_quota(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert sum(load.split_quota(2816, {"x": 64, "y": 32, "z": 8}).values()) == 2816


def test_priority_assignment_is_keyed_by_id() -> None:
    jobs = [Job(id=f"j{i}", submit=0, gpus=1, duration=1, team="t") for i in range(300)]
    mix = (("hi", 0.1), ("lo", 0.9))
    a = philly.assign_priorities(jobs, mix, seed=1)
    b = philly.assign_priorities(jobs[100:], mix, seed=1)
    assert [j.priority for j in a[100:]] == [j.priority for j in b]
    assert 10 <= sum(j.priority == "hi" for j in a) <= 60


def test_openb_whole_gpu_pods_and_types(data_dir: Path) -> None:
    jobs, skipped = openb.read_pods(data_dir / "openb_pods_sample.csv")
    assert jobs and all(j.gpus >= 1 for j in jobs)
    assert skipped.fractional > 0
    typed = [j for j in jobs if j.gpu_type]
    assert typed and all(
        set(j.gpu_types) <= {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"} for j in typed
    )
    conv = convert_openb(data_dir / "openb_nodes_sample.csv", data_dir / "openb_pods_sample.csv")
    assert conv.cluster.total_gpus > 0 and len(conv.cluster.gpu_types) > 2
    assert conv.jobs[0].submit == 0.0


def test_openb_with_shares_keeps_fractional_pods_and_every_pods_cpu_and_memory(data_dir: Path) -> None:
    whole, skipped = openb.read_pods(data_dir / "openb_pods_sample.csv")
    full, none_skipped = openb.read_pods(data_dir / "openb_pods_sample.csv", shares=True)
    fractional = [j for j in full if j.gpu_milli is not None]
    # (the fractional pods that never ran are skipped as never_ran instead)
    assert 0 < len(fractional) <= skipped.fractional and none_skipped.fractional == 0
    assert len(fractional) + none_skipped.never_ran - skipped.never_ran == skipped.fractional
    assert all(j.gpus == 1 and 0 < (j.gpu_milli or 0) < 1000 for j in fractional)
    assert all(j.cpu_milli > 0 and j.memory_mib > 0 for j in full) and all(j.cpu_milli == 0 for j in whole)
    assert {j.id for j in whole} < {j.id for j in full}


def test_an_openb_slice_with_shares_replays_through_the_scheduler(
    data_dir: Path, gpu_joins: GpuJoins
) -> None:
    """Fractions, CPU, memory and GPU types through the real core (the simulator calls it as the scheduler
    does), arrivals compressed: every job ends, none is rejected, and shares ran side by side on a GPU."""
    conv = convert_openb(
        data_dir / "openb_nodes_sample.csv", data_dir / "openb_pods_sample.csv", target_load=1.2, shares=True
    )
    assert conv.info["fractional_jobs"] > 0
    sim = Simulator(conv.jobs, conv.cluster, "rallypoint", options=SimOptions(tick=600.0))
    result = sim.run().summary
    assert result["completed"] == len(conv.jobs) and result["rejected"] == 0, result
    assert gpu_joins.shares, "no fractional pod ever joined a shared GPU"
