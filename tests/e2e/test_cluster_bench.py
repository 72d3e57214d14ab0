"""End to end: `rally bench cluster` at a tiny size prints every figure the scale issue asks for, sanely.

40 simulated nodes in 2 fleet processes (a heartbeat a second, so the monitor's thresholds are 3 s and
8 s), 40 HTTP submissions, a burst of 8 one-node gangs, a burst of capacity (the cluster filled, 8
one-node gangs queued, a gang of 8 nodes cancelled), 8 nodes silenced, the leader killed, 10 short real
jobs on 2 real agents for the zombie count. Jobs of the bursts run 1 s (those of the submissions 2 s).
On the production shape of issue 34: three nats-servers (R3), two job controllers and two health monitors,
each service's busiest replica killed at the end (the handovers).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

FIELDS = (
    "submissions_per_s",
    "raw_publish_per_s",
    "raw_append_per_s",
    "submissions_over_raw_append",
    "http_ceiling_per_s",
    "submissions_over_http_ceiling",
    "http_ceiling_over_raw",
    "binds_per_s",
    "append_per_s",
    "cycle_ms_live",
    "cycle_ms_core",
    "cycle_cpu_ms_live",
    "cycle_cpu_ms_core",
    "capacity_binds_per_s",
    "capacity_cycle_cpu_ms",
    "capacity_write_events_per_s",
    "burst_write_events_per_s",
    "silence_flagged_max_s",
    "silence_threshold_s",
    "zombies",
    "submit_latency_s_p50",
    "submit_to_running_s_p50",
    "failover_s",
    "rss_mb",
)


def test_the_cluster_bench_reports_every_figure() -> None:
    argv = [
        sys.executable, "-m", "rallypoint.cli.main", "bench", "cluster", "--nodes", "40", "--jobs", "40",
        "--burst", "8", "--capacity", "8", "--silence", "8", "--fleets", "2", "--zombie-jobs", "10",
        "--phase-timeout", "60", "--heartbeat-interval", "1", "--job-seconds", "1", "--json",
        "--nats-servers", "3", "--replicas", "job-controller=2,health-monitor=2",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)  # a loaded host
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    missing = [f for f in FIELDS if res.get(f) is None]
    assert not missing, f"missing or null: {missing} in {res}"
    assert res["submissions"] == 40 and res["submitted_running"] == 40
    assert res["submissions_per_s"] > 0 and res["raw_publish_per_s"] > 0
    assert res["submissions_cpu_ms_per_job"]["api"] > 0
    cpu = res["submissions_cpu_ms_per_job"]
    assert {"job-controller-1", "job-controller-2", "nats-server-1", "nats-server-2", "nats-server-3"} <= set(
        cpu
    )
    # the settled window: every job running and folded everywhere; the sums are of what it lists
    assert res["submissions_cpu_window_s"] > 0 and res["idle_cpu_ms_per_s"] >= 0
    # the yardstick: this machine's speed just before and after the window, and the sum over it
    assert len(res["reference_fold_us_per_job_before_after"]) == 2
    assert all(us > 0 for us in res["reference_fold_us_per_job_before_after"])
    over = res["submissions_cpu_ms_per_job_sum"] * 1000 / res["reference_fold_us_per_job"]
    assert res["submissions_cpu_over_reference"] == pytest.approx(over, rel=0.02, abs=0.2)
    assert "postgres" in cpu  # the projector's database: its server and backends
    # the leader decided the window's jobs in cycles whose computing CPU its own counters give
    assert res["submissions_cycles"] >= 1 and res["submissions_cycle_cpu_ms_per_job"] > 0
    assert abs(res["submissions_cpu_ms_per_job_sum"] - sum(cpu.values())) < 0.01
    outside = sum(ms for name, ms in cpu.items() if name == "bench" or name.startswith("fleet-"))
    assert abs(res["submissions_cpu_ms_per_job_control_plane"] - (sum(cpu.values()) - outside)) < 0.01
    for service in ("job-controller", "health-monitor"):
        handover = res["handovers"][service]
        assert handover["partitions"] > 0 and handover["retaken"] == handover["partitions"], handover
        assert 0 < handover["handover_s"] < 15, handover
    assert res["burst_bound"] == 8 and res["binds_per_s"] > 0
    assert 0 < res["cycle_ms_live"] < 10_000 and 0 < res["cycle_ms_core"] < 10_000
    assert 0 < res["cycle_cpu_ms_live"] < 10_000
    # the burst of capacity: 8 one-node gangs waited behind gangs filling all 40 nodes, and every one was
    # bound after the gang of 8 nodes was cancelled
    assert res["capacity_fillers"] == 5 and res["capacity_bound"] == 8
    assert 0 < res["capacity_first_bind_s"] <= res["capacity_all_bound_s"] < 30
    # the leader's writes of that phase stored at least those 8 binds, at a rate of its own writes' time
    assert res["capacity_write_events"] >= 8 and res["capacity_write_writes"] >= 1
    per_s = res["capacity_write_events"] / res["capacity_write_seconds"]
    assert res["capacity_write_events_per_s"] == pytest.approx(per_s, rel=0.05)
    # every silenced node flagged, none too early, none of the others
    assert res["silence_flagged"] == res["silence_nodes"] == 8
    # counted from the silencing signal; a node's last heartbeat was up to one interval (1 s) before it
    assert res["silence_threshold_s"] - 1 <= res["silence_flagged_max_s"] < res["silence_threshold_s"] + 10
    assert res["false_alarms"] == 0 and res["false_alarms_while_starting"] == 0
    assert res["services_exited"] == {}  # no service crashed before the kills (none restarts here)
    assert 0 < res["failover_s"] < 30
    assert res["zombies"] == 0 and res["zombie_jobs_completed"] == 10
    services = {"api", "scheduler-1", "health-monitor-1", "job-controller-2", "nats-server-3", "fleet-1"}
    assert services <= set(res["rss_mb"]) and all(mb > 0 for mb in res["rss_mb"].values())
