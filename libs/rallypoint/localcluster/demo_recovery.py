"""The demo's second act: a node hangs under a running 2-node gang, and the gang carries on.

It runs the repository's deterministic training example on 16 GPUs, waits for its first checkpoint,
freezes one of its nodes (agent and ranks stopped, as a wedged machine), and prints what the cluster did:
when it noticed, which node replaced the hung one, which step the ranks resumed from and the work lost.
The hung node is thawed at the end and must come back to service by itself.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from .http import call
from .supervisor import LocalCluster

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_numpy.py"


def job_view(api: str, job_id: str) -> dict[str, Any]:
    status, view = call("GET", f"{api}/v1/jobs/{job_id}")
    return dict(view) if status == 200 else {}


def wait_until(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    return None


def node_status(api: str, node_id: str) -> str:
    _, body = call("GET", f"{api}/v1/nodes")
    return next((str(n["status"]) for n in body.get("nodes", []) if n["node_id"] == node_id), "?")


def run_recovery_act(cluster: LocalCluster, *, timeout: float = 150.0) -> dict[str, Any]:
    """Hang a node under a running gang; returns the gang's final view (state ``completed`` on success)."""
    api = cluster.api_url
    command = [sys.executable, str(EXAMPLE), "--steps", "80", "--step-time", "0.2", "--ckpt-every", "10"]
    body = {"name": "resilient-16", "team": "demo", "gpus": 16, "gpus_per_task": 8, "ranks_per_task": 1}
    status, answer = call("POST", f"{api}/v1/jobs", {**body, "command": command})
    if status != 202:
        raise RuntimeError(f"submitting resilient-16 failed: {status} {answer}")
    job_id = str(answer["job_id"])
    print(f"\nrecovery: resilient-16 ({job_id}) trains on 16 GPUs, checkpointing every 10 steps")
    view = wait_until(lambda: (v := job_view(api, job_id)).get("state") == "running" and v, 60) or {}
    first_checkpoint = wait_until(
        lambda: any((cluster.checkpoint_root / job_id).glob("step-*/manifest.json")), 60
    )
    if not view or not first_checkpoint:
        return job_view(api, job_id)
    hung = view["nodes"][-1]
    print(f"recovery: {view['nodes']} run it; {hung} now hangs (agent and ranks frozen)")
    cluster.freeze_node(hung, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        repaired = wait_until(
            lambda: (v := job_view(api, job_id)).get("attempt", 1) >= 2 and v["state"] == "running" and v,
            timeout,
        )
        if repaired:
            recovery = repaired["recovery"]
            print(
                f"recovery: after {time.monotonic() - frozen:.1f} s the gang runs again on "
                f"{repaired['nodes']} (attempt {repaired['attempt']}), resumed from step "
                f"{recovery['resume_step']}; {recovery['lost_gpu_s']:.0f} GPU-seconds of work lost"
            )
        done = (
            wait_until(
                lambda: (v := job_view(api, job_id)).get("state") in ("completed", "failed") and v, timeout
            )
            or {}
        )
    finally:
        cluster.freeze_node(hung, signal.SIGCONT)
    back = wait_until(lambda: node_status(api, hung) == "up", 60)
    where = "is back in service" if back else "did not come back"
    print(f"recovery: resilient-16 {done.get('state', 'unfinished')}; {hung} {where}")
    return done if back else {**done, "state": "node-not-back"}
