"""Record the event history that tests/replay replays: `python -m tests.replay.record_history`.

Runs a real local cluster (4 nodes x 8 GPUs, 2 racks) through a representative day in miniature — a 16-GPU
gang, a failing job, small jobs, a cancel, a production gang preempting best-effort work, a scheduler
failover — and exports its log to ``data/history.jsonl`` with the expected outcome in ``data/expected.json``.
Re-record only when the log's meaning changes on purpose, and say why in the commit.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.cli.replay import export_history, fold, read_history, summarize
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

DATA = Path(__file__).parent / "data"
TERMINAL = {"completed", "failed", "cancelled", "rejected"}


def _submit(
    api: str, name: str, gpus: int, per_task: int, command: list[str], priority: str = "training-standard"
) -> str:
    body = {
        "name": name,
        "team": "replay",
        "gpus": gpus,
        "gpus_per_task": per_task,
        "ranks_per_task": 1,
        "priority": priority,
        "command": command,
    }
    status, answer = call("POST", f"{api}/v1/jobs", body, headers={"Idempotency-Key": name})
    assert status == 202, answer
    return str(answer["job_id"])


def _wait(api: str, job_id: str, states: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, view = call("GET", f"{api}/v1/jobs/{job_id}")
        if status == 200 and view["state"] in states:
            return dict(view)
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} never reached {states}")


def record() -> None:
    with LocalCluster(Path(tempfile.mkdtemp(prefix="rally-record-")), nodes=4, gpus_per_node=8, racks=2) as c:
        api = c.api_url
        gang = _submit(api, "gang", 16, 8, ["sleep", "1"])
        fails = _submit(api, "fails", 2, 2, ["sh", "-c", "exit 3"])
        smalls = [_submit(api, f"small-{i}", g, g, ["sleep", "0.5"]) for i, g in enumerate((1, 2, 4, 3))]
        sleeper = _submit(api, "cancelled", 4, 4, ["sleep", "300"])
        _wait(api, sleeper, {"running"})
        call("DELETE", f"{api}/v1/jobs/{sleeper}")
        for job_id in (gang, fails, *smalls, sleeper):
            _wait(api, job_id, TERMINAL)
        fillers = [_submit(api, f"filler-{i}", 8, 8, ["sleep", "300"], "best-effort") for i in range(4)]
        for filler in fillers:
            _wait(api, filler, {"running"})
        urgent = _submit(api, "urgent", 16, 8, ["sleep", "0.5"], "production")
        _wait(api, urgent, TERMINAL)
        leader = asyncio.run(_leader(c.nats_url))
        c.kill(leader, signal.SIGKILL)
        after = _submit(api, "after-failover", 8, 8, ["sleep", "0.5"])
        for filler in fillers:
            _wait(api, filler, {"running", "bound"} | TERMINAL)
            call("DELETE", f"{api}/v1/jobs/{filler}")
        for job_id in (*fillers, after):
            _wait(api, job_id, TERMINAL)
        time.sleep(2)
        history = asyncio.run(read_history(c.nats_url, None))
    DATA.mkdir(exist_ok=True)
    export_history(history, str(DATA / "history.jsonl"))
    state = fold(history)
    expected = {
        "summary": summarize(state),
        "jobs": {
            job.spec.name: {"state": job.state, "attempt": job.attempt, "preemptions": job.preemptions}
            for job in state.jobs.values()
        },
    }
    (DATA / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    print(f"recorded {len(history)} events; final hash {expected['summary']['hash']}")


async def _leader(nats_url: str) -> str:
    return fold(await read_history(nats_url, None)).leader_id


if __name__ == "__main__":
    record()
