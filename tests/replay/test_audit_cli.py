"""`rally replay --history FILE --verify-decisions`: passes on the recorded log, fails on a tampered one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HISTORY = Path(__file__).parent / "data" / "history.jsonl"


def audit(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rallypoint.cli.main", "replay", "--history", str(path), "--verify-decisions"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_recorded_log_passes_the_audit() -> None:
    result = audit(HISTORY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 differ" in result.stdout


def test_a_bind_moved_to_other_gpus_is_caught(tmp_path: Path) -> None:
    lines = HISTORY.read_text().splitlines()
    seq = None
    for index, line in enumerate(lines):
        record = json.loads(line)
        event = record["event"]
        if event["type"] == "GangBound.v1" and len(event["placements"][0]["gpus"]) < 8:
            placement = event["placements"][0]
            # Same node, same count, different GPUs: a plausible forgery only recomputation reveals.
            used = set(placement["gpus"])
            placement["gpus"] = sorted(set(range(8)) - used)[: len(used)]
            lines[index] = json.dumps(record)
            seq = record["seq"]
            break
    assert seq is not None, "the recorded history has no bind smaller than a node to tamper with"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    result = audit(tampered)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"seq {seq} GangBound" in result.stdout


def test_the_plain_replay_prints_the_state_hash_of_the_file() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rallypoint.cli.main", "replay", "--history", str(HISTORY), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    summary = json.loads(result.stdout)
    expected = json.loads((HISTORY.parent / "expected.json").read_text())["summary"]
    assert summary["seq"] == expected["seq"] and summary["jobs"] == expected["jobs"]
