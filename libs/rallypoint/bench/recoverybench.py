"""`rally bench recovery`: node failure -> every rank running again from the checkpoint, on a real cluster.

Each trial submits a 2-node gang running the repository's deterministic training example, waits until it
has committed a checkpoint, hangs one of its nodes (agent and ranks frozen, as a wedged machine) and
times, from the freeze:
- detection: the log records the hung node as lost (``NodeLost``), the verdict every recovery waits for;
- interruption: the gang's ranks on the healthy node stopped and its failure recorded (``JobInterrupted``);
- recovery: every rank of the repaired attempt is launched again (``JobStarted`` of the next attempt),
  resuming from the last complete checkpoint.
The node is thawed, the job cancelled and the node back in service before the next trial.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import Event, JobInterrupted, JobStarted, NodeLost, subjects
from rallypoint.localcluster.demo_recovery import job_view, node_status, wait_until
from rallypoint.localcluster.http import call
from rallypoint.localcluster.supervisor import LocalCluster

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_numpy.py"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index], 3)


def _events_of(cluster: LocalCluster, job_id: str) -> list[Event]:
    async def read() -> list[Event]:
        log = await EventLog.connect(cluster.nats_url, name="bench-recovery", create=False)
        try:
            return [
                event
                async for r in log.replay(quarantine=True)
                if isinstance(r, Recorded)
                for event in subjects.members(r.event)  # a GangsBound's binds, each its job's own
                if job_id in (getattr(event, "job_id", None), getattr(event, "node_id", None))
            ]
        finally:
            await log.close()

    return asyncio.run(read())


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    value = wait_until(predicate, timeout)
    if not value:
        raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
    return value


def _job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return job_view(cluster.api_url, job_id)


def _node_status(cluster: LocalCluster, node_id: str) -> str:
    return node_status(cluster.api_url, node_id)


def one_trial(cluster: LocalCluster, trial: int) -> tuple[float, float, float]:
    """(detection s, interruption s, recovery s) of one hung node under a running 2-node gang."""
    command = [sys.executable, str(EXAMPLE), "--steps", "100000", "--step-time", "0.1", "--ckpt-every", "10"]
    body = {"name": f"bench-{trial}", "team": "bench", "gpus": 16, "gpus_per_task": 8, "ranks_per_task": 1}
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", {**body, "command": command})
    if status != 202:
        raise RuntimeError(f"submit refused: {answer}")
    job_id = str(answer["job_id"])
    view = _wait(lambda: (v := _job(cluster, job_id)).get("state") == "running" and v, 60, "the gang to run")
    checkpoints = cluster.checkpoint_root / job_id
    _wait(lambda: any(checkpoints.glob("step-*/manifest.json")), 60, "a first checkpoint")
    hung = view["nodes"][-1]
    cluster.freeze_node(hung, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        _wait(
            lambda: (
                _job(cluster, job_id).get("attempt", 1) >= 2 and _job(cluster, job_id)["state"] == "running"
            ),
            120,
            "the gang to run again",
        )
    finally:
        cluster.freeze_node(hung, signal.SIGCONT)
    events = _events_of(cluster, job_id) + _events_of(cluster, hung)
    lost = next(e for e in events if isinstance(e, NodeLost) and e.at >= frozen_at)
    interrupted = next(e for e in events if isinstance(e, JobInterrupted))
    restarted = next(e for e in events if isinstance(e, JobStarted) and e.attempt == 2)
    call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
    _wait(lambda: _job(cluster, job_id).get("state") == "cancelled", 60, "the cancel")
    _wait(lambda: _node_status(cluster, hung) == "up", 60, f"{hung} to return")
    return lost.at - frozen_at, interrupted.at - frozen_at, restarted.at - frozen_at


def run_bench(trials: int = 10, nodes: int = 6) -> dict[str, Any]:
    detection: list[float] = []
    interruption: list[float] = []
    recovery: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rally-bench-recovery-") as folder,
        LocalCluster(Path(folder), nodes=nodes, gpus_per_node=8, racks=2, with_projector=False) as cluster,
    ):
        for trial in range(trials):
            found, stopped, back = one_trial(cluster, trial)
            detection.append(found)
            interruption.append(stopped)
            recovery.append(back)
    return {
        "trials": trials,
        "detection_s_p50": _percentile(detection, 0.5),
        "detection_s_p95": _percentile(detection, 0.95),
        "interrupted_s_p50": _percentile(interruption, 0.5),
        "interrupted_s_p95": _percentile(interruption, 0.95),
        "recovery_s_p50": _percentile(recovery, 0.5),
        "recovery_s_p95": _percentile(recovery, 0.95),
        "recovery_s_mean": round(statistics.fmean(recovery), 3),
        "targets": {"recovery_s": 30.0, "detection_s": 10.0},
    }
