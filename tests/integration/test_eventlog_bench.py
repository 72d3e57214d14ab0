"""`rally bench eventlog` runs end to end on its own embedded server (figures are checked by `make bench`)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_eventlog_bench_runs_and_replays_everything_it_wrote() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.cli.main", "bench", "eventlog", "--events", "40", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(result.stdout)
    # 40 sequential + 40 concurrent + 10 fenced appends + 40 in fenced batches, all replayed.
    assert figures["events_replayed"] == 130
    assert all(
        figures[k] > 0
        for k in (
            "append_sequential_per_s",
            "append_fenced_per_s",
            "append_fenced_batch_per_s",
            "replay_and_fold_per_s",
        )
    )
