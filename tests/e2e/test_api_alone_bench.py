"""``python -m rallypoint.bench.apibench``: the real API process alone beside raw JetStream publishes.

Small numbers: what is checked is that it measures what it says (every submission answered 202 and
counted once, the references measured, the API's CPU read from its own process), not how fast."""

from __future__ import annotations

import json
import subprocess
import sys


def test_api_bench_reports_submissions_beside_both_raw_references() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rallypoint.bench.apibench",
            "--nodes",
            "3",
            "--jobs",
            "40",
            "--rounds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    res = json.loads(done.stdout.strip().splitlines()[-1])
    assert res["nodes"] == 3 and res["concurrency"] == 16 and res["rounds"] == 2
    assert res["submissions"] == 80 and res["submissions_failed"] == 0
    assert res["submissions_per_s"] > 0 and res["raw_publish_per_s"] > 0 and res["raw_append_per_s"] > 0
    # the ratios are of the unrounded rates: equal to the rounded ones' within the rounding
    over_raw = res["submissions_per_s"] / res["raw_publish_per_s"]
    over_append = res["submissions_per_s"] / res["raw_append_per_s"]
    assert abs(res["submissions_over_raw"] - over_raw) < 0.002
    assert abs(res["submissions_over_raw_append"] - over_append) < 0.002
    # the bare HTTP front beside them (it raises if it refused one request)
    assert res["http_ceiling_per_s"] > 0
    assert abs(res["http_ceiling_over_raw"] - res["http_ceiling_per_s"] / res["raw_publish_per_s"]) < 0.002
    over_ceiling = res["submissions_per_s"] / res["http_ceiling_per_s"]
    assert abs(res["submissions_over_http_ceiling"] - over_ceiling) < 0.002
    assert res["api_cpu_ms_per_submission"] > 0
