"""Record the history the usage tests replay: `python -m tests.replay.record_usage_history`.

A real local cluster (2 nodes x 4 GPUs) runs: a job that completes, a job that fails, is retried and fails
again (two attempts), two best-effort gangs preempted by a production gang and then run again (two
attempts each) until cancelled. The log is exported to ``data/usage_history.jsonl``; the usage tests
check that every attempt is charged and that the log and the PostgreSQL read model agree to the bit.
Re-record only when the log's meaning changes on purpose.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.cli.replay import export_history, read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

DATA = Path(__file__).parent / "data"
TERMINAL = {"completed", "failed", "cancelled", "rejected"}


def submit(api: str, name: str, team: str, gpus: int, command: list[str], **extra: Any) -> str:
    per_task = min(gpus, 4)
    body = {"name": name, "team": team, "gpus": gpus, "gpus_per_task": per_task, "command": command, **extra}
    status, answer = call("POST", f"{api}/v1/jobs", body, headers={"Idempotency-Key": name})
    assert status == 202, answer
    return str(answer["job_id"])


def wait(api: str, job_id: str, states: set[str], *, attempt: int = 0, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, view = call("GET", f"{api}/v1/jobs/{job_id}")
        if status == 200 and view["state"] in states and view["attempt"] >= attempt:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} never reached {states} (attempt {attempt})")


def record() -> None:
    with LocalCluster(Path(tempfile.mkdtemp(prefix="rally-usage-")), nodes=2, gpus_per_node=4, racks=1) as c:
        api = c.api_url
        done = submit(api, "done", "lang", 2, ["sh", "-c", "echo hello; sleep 0.5"])
        retry = submit(api, "retry", "lang", 2, ["sh", "-c", "echo failing; exit 3"], max_retries=1)
        for job_id in (done, retry):
            wait(api, job_id, TERMINAL)
        fillers = [
            submit(api, f"filler-{i}", "vision", 4, ["sleep", "300"], priority="best-effort")
            for i in range(2)
        ]
        for filler in fillers:
            wait(api, filler, {"running"})
        urgent = submit(api, "urgent", "lang", 8, ["sleep", "1"], priority="production")
        wait(api, urgent, TERMINAL)
        for filler in fillers:
            wait(api, filler, {"running"}, attempt=2)
            call("DELETE", f"{api}/v1/jobs/{filler}")
        for filler in fillers:
            wait(api, filler, TERMINAL)
        time.sleep(2)
        history = asyncio.run(read_history(c.nats_url, None))
    DATA.mkdir(exist_ok=True)
    export_history(history, str(DATA / "usage_history.jsonl"))
    print(f"recorded {len(history)} events")


if __name__ == "__main__":
    record()
