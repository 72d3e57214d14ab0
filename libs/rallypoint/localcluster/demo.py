"""`rally demo`: a local cluster, a mixed batch of jobs, live progress, a summary, a clean exit.

The batch: a 16-GPU gang over 2 nodes, a job that fails, several 1-4 GPU jobs, one job cancelled
while it runs. Then a node hangs under a running 16-GPU gang, which resumes on a replacement node from
its last checkpoint (``demo_recovery``). The demo exits 0 only when every job ended the way it should
and nothing is left running.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rallypoint.eventlog.connection import without_password
from rallypoint.infra.tempdirs import owned_tempdir

from .demo_recovery import run_recovery_act
from .http import call
from .supervisor import LocalCluster

TERMINAL = {"completed", "failed", "cancelled", "rejected"}


@dataclass(frozen=True)
class DemoJob:
    name: str
    gpus: int
    per_task: int
    sleep: float
    exit_code: int
    expect: str
    cancel: bool = False


BATCH: tuple[DemoJob, ...] = (
    DemoJob("gang-16", 16, 8, 4.0, 0, "completed"),
    DemoJob("bad-config", 2, 2, 0.5, 3, "failed"),
    DemoJob("small-1", 1, 1, 2.0, 0, "completed"),
    DemoJob("small-2", 2, 2, 3.0, 0, "completed"),
    DemoJob("small-3", 4, 4, 2.0, 0, "completed"),
    DemoJob("small-4", 4, 4, 1.0, 0, "completed"),
    DemoJob("small-5", 3, 3, 2.5, 0, "completed"),
    DemoJob("sweep-cancel", 4, 4, 600.0, 0, "cancelled", cancel=True),
    DemoJob("after-gang", 8, 8, 1.0, 0, "completed"),
)


def _submit(api: str, job: DemoJob, probe_dir: Path, token: str) -> str:
    command = [
        sys.executable,
        "-m",
        "rallypoint.localcluster.rankprobe",
        "--out",
        str(probe_dir),
        "--sleep",
        str(job.sleep),
        "--exit",
        str(job.exit_code),
    ]
    # No "team": the demo team's token says which team it is.
    body = {
        "name": job.name,
        "gpus": job.gpus,
        "gpus_per_task": job.per_task,
        "ranks_per_task": job.per_task,
        "command": command,
    }
    key = {"Idempotency-Key": f"demo-{job.name}"}
    status, answer = call("POST", f"{api}/v1/jobs", body, headers=key, token=token)
    if status != 202:
        raise RuntimeError(f"submitting {job.name} failed: {status} {answer}")
    return str(answer["job_id"])


def _table(jobs: list[dict[str, Any]]) -> str:
    lines = [f"  {'NAME':<14}{'STATE':<11}{'GPUS':>5}  NODES / REASON"]
    for job in jobs:
        nodes = ",".join(sorted({p["node_id"] for p in job.get("allocation") or []}))
        where = nodes or (job.get("pending_reason") or {}).get("code") or ""
        lines.append(f"  {job['name']:<14}{job['state']:<11}{job['gpus']:>5}  {where}")
    return "\n".join(lines)


def run_demo(nodes: int, gpus_per_node: int, racks: int, *, timeout: float = 180.0) -> int:
    """The demo in a temporary folder, removed afterwards; kept, and named, when the demo failed (its
    services' logs say why)."""
    workdir = owned_tempdir("rally-demo-")  # a demo killed with -9 leaves it to the next one
    code = 1
    try:
        code = _run_demo_in(workdir, nodes, gpus_per_node, racks, timeout=timeout)
        return code
    finally:
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"the demo's state and logs are kept in {workdir}", file=sys.stderr)


def _run_demo_in(workdir: Path, nodes: int, gpus_per_node: int, racks: int, *, timeout: float) -> int:
    shape = f"{nodes} nodes x {gpus_per_node} GPUs in {racks} racks"
    print(f"starting a local cluster: {shape} (state in {workdir})")
    cluster = LocalCluster(workdir, nodes=nodes, gpus_per_node=gpus_per_node, racks=racks)
    started = time.monotonic()
    try:
        cluster.start()
        # ranks run as an unprivileged user and reach, of the cluster's folder, only what their sandbox shows
        probe_dir = cluster.give_to_ranks(cluster.shared_dir / "ranks")
        elapsed = time.monotonic() - started
        print(
            f"cluster up in {elapsed:.1f} s: API {cluster.api_url}, NATS {without_password(cluster.nats_url)}"
        )
        api = cluster.api_url
        token = cluster.token_for("demo")  # the batch runs as team demo, as a user would
        print(f"dashboard: {api}/?token={token}")
        print(f"metrics: {cluster.metrics_urls()['scheduler-1']} (every service's: docs/observability.md)")
        ids = {job.name: _submit(api, job, probe_dir, token) for job in BATCH}
        print(f"submitted {len(ids)} jobs")
        cancelled = False
        deadline = time.monotonic() + timeout
        last_render = ""
        views: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            for name, job_id in ids.items():
                status, view = call("GET", f"{api}/v1/jobs/{job_id}", token=token)
                if status == 200:
                    views[name] = view
            canceller = views.get("sweep-cancel")
            if not cancelled and canceller is not None and canceller["state"] == "running":
                status, _ = call("DELETE", f"{api}/v1/jobs/{ids['sweep-cancel']}", token=token)
                cancelled = status == 202
                print("cancel requested for sweep-cancel")
            render = _table([views[j.name] for j in BATCH if j.name in views])
            if render != last_render:
                print(f"[{time.monotonic() - started:6.1f} s]\n{render}")
                last_render = render
            if len(views) == len(BATCH) and all(v["state"] in TERMINAL for v in views.values()):
                break
            dead = cluster.dead_services()
            if dead:
                print(f"error: services died: {', '.join(dead)}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        outcome = _summarize(views, nodes * gpus_per_node)
        resilient = run_recovery_act(cluster)
        if resilient.get("state") != "completed":
            print(f"  unexpected outcome of the recovery act: {resilient.get('state')}", file=sys.stderr)
            return 1
        return outcome
    finally:
        cluster.stop()
        leftovers = [n for n, p in cluster.processes.items() if p.running()]
        print(
            "cluster stopped" + (f"; still running: {leftovers}" if leftovers else "; no process left behind")
        )


def _summarize(views: dict[str, dict[str, Any]], total_gpus: int) -> int:
    by_state: dict[str, int] = {}
    for view in views.values():
        by_state[view["state"]] = by_state.get(view["state"], 0) + 1
    print("\nsummary")
    print("  jobs by final state: " + ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())))
    queue_times = [v["bound_at"] - v["submitted_at"] for v in views.values() if v.get("bound_at")]
    if queue_times:
        print(f"  queue time: avg {statistics.mean(queue_times):.2f} s, max {max(queue_times):.2f} s")
    busy = sum(
        v["gpus"] * (v["ended_at"] - v["started_at"])
        for v in views.values()
        if v.get("started_at") and v.get("ended_at")
    )
    starts = [v["submitted_at"] for v in views.values()]
    ends = [v["ended_at"] for v in views.values() if v.get("ended_at")]
    if starts and ends:
        span = max(ends) - min(starts)
        print(
            f"  GPU utilization over the batch: {busy / (total_gpus * span):.1%} of {total_gpus} GPUs "
            f"for {span:.1f} s"
        )
    wrong = [
        f"{j.name}: {views.get(j.name, {}).get('state', 'missing')} (expected {j.expect})"
        for j in BATCH
        if views.get(j.name, {}).get("state") != j.expect
    ]
    if wrong:
        print("  unexpected outcomes: " + "; ".join(wrong), file=sys.stderr)
        return 1
    print("  every job ended as expected")
    return 0
