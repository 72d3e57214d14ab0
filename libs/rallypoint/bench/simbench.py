"""``make bench``: simulator speed on the two sizes issue 4 names.

    python -m rallypoint.bench.simbench [--only philly30|synth100k] [--policy rallypoint] [--out FILE.md]

- ``philly30``: 30 days of Philly (2017-10-01 .. 2017-10-31, all VCs, tens of thousands of jobs) on the real
  2,816-GPU cluster with per-VC quotas; target < 60 s.
- ``synth100k``: a synthetic day of 100,000 jobs on 100,000 GPUs (12,500 nodes, racks of 25, 20 racks per
  spine) at offered load 0.9; target < 600 s.

Wall time counts the simulation only (loading and converting are reported apart).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rallypoint.sim.run import run_policy
from rallypoint.sim.synth import synth_cluster, synth_day
from rallypoint.traces import convert as cv


def bench_philly30(traces: Path, policy: str) -> dict[str, Any]:
    t = time.perf_counter()
    conv = cv.convert_philly(
        traces / "philly" / "philly_open.csv",
        traces / "philly" / "philly_vc.csv",
        datetime(2017, 10, 1),
        30.0,
    )
    load_s = time.perf_counter() - t
    res = run_policy(conv.jobs, conv.cluster, conv.queues, policy)
    s = res.summary
    return {
        "name": "philly30",
        "policy": policy,
        "jobs": len(conv.jobs),
        "gpus": conv.cluster.total_gpus,
        "prepare_s": load_s,
        "sim_s": s["sim_wall_s"],
        "cycles": s["cycles"],
        "completed": s["completed"],
        "avg_jct": s["jct"]["avg"],
        "target_s": 60.0,
    }


def bench_synth(policy: str, jobs: int = 100_000, gpus: int = 100_000) -> dict[str, Any]:
    t = time.perf_counter()
    cluster = synth_cluster(gpus, nodes_per_rack=25, racks_per_spine=20)
    wl, q = synth_day(jobs, cluster.total_gpus, seed=1)
    load_s = time.perf_counter() - t
    res = run_policy(wl, cluster, q, policy)
    s = res.summary
    return {
        "name": f"synth{jobs // 1000}k",
        "policy": policy,
        "jobs": jobs,
        "gpus": cluster.total_gpus,
        "prepare_s": load_s,
        "sim_s": s["sim_wall_s"],
        "cycles": s["cycles"],
        "completed": s["completed"],
        "avg_jct": s["jct"]["avg"],
        "target_s": 600.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rallypoint.bench.simbench")
    ap.add_argument("--traces", type=Path, default=cv.default_traces_dir())
    ap.add_argument("--only", choices=["philly30", "synth100k"])
    ap.add_argument("--policy", default="rallypoint")
    ap.add_argument("--synth-jobs", type=int, default=100_000)
    ap.add_argument("--synth-gpus", type=int, default=100_000)
    ap.add_argument("--out", type=Path, help="also append the result table (Markdown) to this file")
    a = ap.parse_args(argv)
    rows = []
    for pol in a.policy.split(","):
        if a.only in (None, "philly30"):
            rows.append(bench_philly30(a.traces, pol))
            print(rows[-1], file=sys.stderr, flush=True)
        if a.only in (None, "synth100k"):
            rows.append(bench_synth(pol, a.synth_jobs, a.synth_gpus))
            print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "",
        "| bench | policy | jobs | GPUs | completed | core cycles | sim wall s | target s | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ok_all = True
    for r in rows:
        ok = r["sim_s"] < r["target_s"]
        ok_all &= ok
        lines.append(
            f"| {r['name']} | {r['policy']} | {r['jobs']:,} | {r['gpus']:,} | {r['completed']:,} | "
            f"{r['cycles']:,} | {r['sim_s']:.1f} | {r['target_s']:.0f} | {'yes' if ok else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    if a.out:
        with a.out.open("a") as f:
            f.write(table + "\n")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
