"""Fractional GPUs, MIG slices and CPU / memory requests on a real local cluster (one agent, 4 GPUs of which
2 in MIG mode, every service its own process).

Three notebooks of 0.3 GPU share one GPU and run at once (the agent evicts none of them for another), each
rank told its share; a whole-GPU job takes the other GPU; a fourth notebook waits for GPU room and one
asking more CPU than the node has waits with a reason naming CPU; the API and `rally nodes` show the
shared GPU; once a notebook ends, the waiting one starts on its share. The log then audits clean:
every bind recomputes bit for bit with sharing on.

MIG jobs get slices of the two MIG GPUs, packed (two 3g slices fill one GPU), each rank seeing its own MIG
device alone; one no layout can hold waits, and starts once a slice ends.
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
from cluster_jobs import job, log_records, submit, wait_for

from rallypoint.audit import verify_decisions
from rallypoint.cli.jobs_cmds import format_nodes
from rallypoint.cli.replay import read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.scheduling import SchedulingPolicy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # GPUs 0-1 whole or shared, 2-3 in MIG mode (the simulated agent's type is an H100 for MIG)
    local = LocalCluster(
        tmp_path_factory.mktemp("sharing"), nodes=1, gpus_per_node=4, racks=1, mig_gpus=(2, 3)
    )
    with local:
        yield local


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


def test_mig_jobs_get_their_own_slices_packed_and_wait_only_when_no_layout_fits(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    first, second = (submit(cluster, f"eval{i}", probe(out, 300), mig_profile="3g.40gb") for i in range(2))
    big = submit(cluster, "eval-big", probe(out, 300), mig_profile="4g.40gb")
    views = {job_id: running(cluster, job_id) for job_id in (first, second, big)}
    devices = {job_id: probe_env(out, job_id)["CUDA_VISIBLE_DEVICES"] for job_id in views}
    assert all(d.startswith("MIG-") for d in devices.values()) and len(set(devices.values())) == 3, devices
    status, nodes = call("GET", f"{cluster.api_url}/v1/nodes")
    assert status == 200
    (node,) = nodes["nodes"] if isinstance(nodes, dict) else nodes
    layouts = sorted(sorted((c["profile"], c["start"]) for c in cuts) for cuts in node["mig_gpus"].values())
    assert layouts == [[("3g.40gb", 0), ("3g.40gb", 4)], [("4g.40gb", 0)]], node["mig_gpus"]
    assert node["gpus"]["free"] <= 2  # MIG GPUs never count as free whole GPUs

    late = submit(cluster, "eval-late", probe(out, 1), mig_profile="4g.40gb")
    message = wait_for(
        cluster, late, lambda v: (v.get("pending_reason") or {}).get("code") == "Resources", "waited"
    )["pending_reason"]["message"]
    assert "no MIG GPU has a free layout" in message, message
    # a 4g slice starts at memory slice 0 only: the 3g there must end, not the one at 4
    at_zero, at_four = sorted((first, second), key=lambda j: job(cluster, j)["allocation"][0]["mig"]["start"])
    call("DELETE", f"{cluster.api_url}/v1/jobs/{at_zero}")
    wait_for(
        cluster, late, lambda v: v.get("state") in ("running", "completed"), "started on the freed slices"
    )
    for job_id in (at_four, big):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")

    last_seq = log_records(cluster, "e2e-mig")[-1][0]
    report = verify_decisions(
        asyncio.run(read_history(cluster.nats_url, last_seq)), SchedulingPolicy("rallypoint")
    )
    assert report.ok and report.mismatches == [] and report.refused == [], report


def test_a_higher_notebook_preempts_a_lower_share_and_takes_its_room(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    low = [
        submit(cluster, f"low{i}", probe(out, 300), gpu_milli=600, priority="best-effort") for i in range(2)
    ]
    for job_id in low:
        running(cluster, job_id)
    high = submit(cluster, "high", probe(out, 300), gpu_milli=600, priority="training-high")
    view = running(cluster, high)
    victims = [job_id for job_id in low if job(cluster, job_id)["preemptions"] == 1]
    assert len(victims) == 1, [job(cluster, j) for j in low]  # one share of one GPU made room
    (victim,) = victims
    assert job(cluster, victim)["state"] in ("pending", "queued"), job(cluster, victim)
    kept = next(j for j in low if j != victim)
    assert job(cluster, kept)["state"] == "running"
    assert view["allocation"][0]["gpus"] != job(cluster, kept)["allocation"][0]["gpus"]
    for job_id in (*low, high):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
