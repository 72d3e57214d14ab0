"""The idle bench's readings: the monitor's heartbeat counter as Prometheus writes it, CPU per second by
process, and the processes under a server (PostgreSQL's backends)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from prometheus_client import generate_latest

from rallypoint.bench.idlebench import _RECEIVED, cpu_ms_per_s
from rallypoint.infra.proccpu import descendants
from rallypoint.observability.instruments import HEARTBEATS_RECEIVED


def test_the_heartbeat_count_is_read_from_the_monitors_own_exposition() -> None:
    HEARTBEATS_RECEIVED.labels(result="undecodable").inc()
    before = _RECEIVED.search(generate_latest())
    start = float(before.group(1)) if before else 0.0
    HEARTBEATS_RECEIVED.labels(result="ok").inc(12_500)
    found = _RECEIVED.search(generate_latest())
    assert found is not None
    assert float(found.group(1)) == start + 12_500  # the "ok" line, not the undecodable one


def test_cpu_is_given_per_second_of_wall_time_busiest_first_for_processes_seen_twice() -> None:
    before = {"nats-server": 10.0, "health-monitor": 5.0, "gone": 1.0}
    after = {"nats-server": 10.6, "health-monitor": 7.25, "fleet-1": 3.0}
    assert cpu_ms_per_s(before, after, seconds=30.0) == {"health-monitor": 75.0, "nats-server": 20.0}


def test_the_processes_under_a_process_are_found_below_a_wrapper() -> None:
    wrapper = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        # until the shell's child has exec'd sleep: on a loaded host it is a forked "sh" for a while
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = descendants(wrapper.pid)
            if found and _comm(found[0]) == "sleep":
                break
            time.sleep(0.02)
        assert len(found) == 1
        assert _comm(found[0]) == "sleep"
    finally:
        for pid in descendants(wrapper.pid):  # the sleep this test started
            os.kill(pid, signal.SIGTERM)
        wrapper.wait(10)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone between the listing and the read
        return ""
