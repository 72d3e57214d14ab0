"""Fractional GPUs and CPU / memory requests on a real local cluster (one agent, 2 GPUs, every service its
own process).

Three notebooks of 0.3 GPU share one GPU and run at once (the agent evicts none of them for another), each
rank told its share; a whole-GPU job takes the other GPU; a fourth notebook waits for GPU room and one
asking more CPU than the node has waits with a reason naming CPU; the API and `rally nodes` show the
shared GPU; once a notebook ends, the waiting one starts on its share. The log then audits clean:
every bind recomputes bit for bit with sharing on.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_jobs import job, log_records, submit

from rallypoint.audit import verify_decisions
from rallypoint.cli.jobs_cmds import format_nodes
from rallypoint.cli.replay import read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.scheduling import SchedulingPolicy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("sharing"), nodes=1, gpus_per_node=2, racks=1)
    with local:
        yield local


def wait_for(cluster: LocalCluster, job_id: str, ok: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = job(cluster, job_id)
        if ok(seen):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never {what}; last seen {seen}")


def running(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return wait_for(cluster, job_id, lambda v: v.get("state") == "running", "ran")


def probe_env(out: Path, job_id: str, timeout: float = 30.0) -> dict[str, str]:
    path = out / f"{job_id}-rank0.json"
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return dict(json.loads(path.read_text()))


def probe(out: Path, seconds: int) -> list[str]:
    """A rank that records its environment (the sharing variables included), then sleeps."""
    return [
        sys.executable,
        "-m",
        "rallypoint.localcluster.rankprobe",
        "--out",
        str(out),
        "--sleep",
        str(seconds),
    ]


def test_fractions_share_a_gpu_whole_jobs_keep_theirs_and_cpu_is_a_resource(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)  # ranks are unprivileged (issue 30)
    fraction = {"gpus": 1, "gpu_milli": 300, "cpu_milli": 100, "memory_mib": 64}
    notebooks = [submit(cluster, f"nb{i}", probe(out, 300), **fraction) for i in range(3)]
    for nb in notebooks:
        running(cluster, nb)
    seen = {nb: probe_env(out, nb) for nb in notebooks}
    devices = {env["CUDA_VISIBLE_DEVICES"] for env in seen.values()}
    assert len(devices) == 1, seen  # one GPU, three shares of 300
    for env in seen.values():
        assert env["RALLY_GPU_MILLI"] == "300" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30", env
    whole = submit(cluster, "whole", probe(out, 300))
    running(cluster, whole)
    assert {probe_env(out, whole)["CUDA_VISIBLE_DEVICES"]} != devices
    # every notebook still runs: the agent evicted none of them for another sharer
    assert all(job(cluster, nb)["state"] == "running" for nb in notebooks)

    late = submit(cluster, "late", probe(out, 1), **fraction)
    hungry = submit(cluster, "hungry", ["true"], gpu_milli=100, cpu_milli=10_000_000)
    wait_for(cluster, late, lambda v: (v.get("pending_reason") or {}).get("code") == "Resources", "waited")
    message = wait_for(
        cluster, hungry, lambda v: "millicores of CPU" in str(v.get("pending_reason")), "waited for CPU"
    )["pending_reason"]["message"]
    assert "needs 10000000 millicores of CPU per task" in message, message

    status, nodes = call("GET", f"{cluster.api_url}/v1/nodes")
    assert status == 200
    (node,) = nodes["nodes"] if isinstance(nodes, dict) else nodes
    device = devices.pop()
    assert node["shared_gpus"] == {device: 900}, node
    assert f"gpu{device}=0.9" in format_nodes([node]).splitlines()[1]

    status, _ = call("DELETE", f"{cluster.api_url}/v1/jobs/{notebooks[0]}")
    assert status in (200, 202)
    wait_for(
        cluster, late, lambda v: v.get("state") in ("running", "completed"), "started on the freed share"
    )
    for job_id in (*notebooks[1:], whole, hungry):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")

    last_seq = log_records(cluster, "e2e-sharing")[-1][0]
    report = verify_decisions(
        asyncio.run(read_history(cluster.nats_url, last_seq)), SchedulingPolicy("rallypoint")
    )
    assert report.ok and report.mismatches == [] and report.refused == [], report
    assert report.verified == report.decisions >= 5
