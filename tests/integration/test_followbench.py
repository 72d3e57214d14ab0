"""The follow bench runs end to end on its own embedded server, and what it follows is what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys

from rallypoint.bench.followbench import Shape, total_events


def test_the_follow_bench_follows_every_event_and_replays_the_same_state() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.bench.followbench", *Shape(8, 20, 1, 4).args(), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(result.stdout)
    # A leader, 8 nodes, and 20 lives of 6 events (submitted, queued, bound, started, 1 rank, completed).
    assert figures["events"] == total_events(Shape(8, 20, 1, 4)) == 1 + 8 + 20 * 6
    assert figures["jobs_completed"] == 20
    assert figures["replay_state_hash"] == figures["state_hash"]
    split = figures["split_us_per_event"]
    assert figures["follow_cpu_us_per_event"] > 0
    assert split["envelope_parse_when_read"] > 0 and split["decode"] > 0 and split["fold"] > 0
    assert figures["replay_events_per_s"] > 0
