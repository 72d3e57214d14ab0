"""The burst benchmark leads a real scheduler loop (lease, epoch, cycles on changes) against a real NATS
server, with the bursts appended from another process, and binds every gang that fits."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_burst_bench_binds_every_gang_of_every_burst() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rallypoint.bench.burstbench",
            "--nodes",
            "40",
            "--burst",
            "15",
            "--rounds",
            "2",
            "--gpus",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(result.stdout)
    assert [r["bound"] for r in figures["rounds"]] == [15, 15]
    assert all(r["cycles"] >= 1 and r["binds_per_s"] > 0 for r in figures["rounds"])
    assert figures["scheduler_cpu_ms_per_job"] > 0
