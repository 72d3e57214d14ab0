"""Issue 32's mixed batch on a real local cluster: two agents of 12 simulated H100s, GPUs 10 and 11 of each
in MIG mode, every service its own process.

A 16-GPU gang, notebooks on fractions of one GPU, evals on MIG slices and CPU-heavy jobs run at the same
time, and every rank sees exactly its own devices: the gang's ranks disjoint whole GPUs, the notebooks one
shared GPU no whole-GPU rank has, each eval its own MIG device. A CPU-heavy job the nodes have no CPU left
for waits with a reason naming CPU. The whole log then audits clean.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_jobs import log_records, submit, wait_for

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.scheduling import SchedulingPolicy

pytestmark = pytest.mark.slow

WHOLE = set(range(10))  # GPUs 0-9 of each node; 10 and 11 run MIG


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("mixed"), nodes=2, gpus_per_node=12, racks=1, mig_gpus=(10, 11)
    )
    with local:
        yield local


def seen_by(out: Path, job_id: str, ranks: int, timeout: float = 60.0) -> list[dict[str, str]]:
    """What each rank of the job recorded of its environment, rank order."""
    deadline = time.monotonic() + timeout
    while len(list(out.glob(f"{job_id}-rank*.json"))) < ranks and time.monotonic() < deadline:
        time.sleep(0.2)
    found = [json.loads(p.read_text()) for p in out.glob(f"{job_id}-rank*.json")]
    assert len(found) == ranks, (job_id, found)
    return sorted(found, key=lambda env: int(env["RANK"]))


def probe(out: Path) -> list[str]:
    return [sys.executable, "-m", "rallypoint.localcluster.rankprobe", "--out", str(out), "--sleep", "300"]


def test_a_gang_notebooks_mig_evals_and_cpu_jobs_run_together_each_rank_on_its_own_devices(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    gang = submit(cluster, "pretrain", probe(out), gpus=16, gpus_per_task=8, ranks_per_task=2)
    notebooks = [submit(cluster, f"nb{i}", probe(out), gpu_milli=300) for i in range(3)]
    evals = [
        submit(cluster, f"eval{i}", probe(out), mig_profile=p)
        for i, p in enumerate(("3g.40gb", "3g.40gb", "2g.20gb"))
    ]
    # each node registers this host's CPU; 60% of it per job: one such job per node
    cpu = next(iter(call("GET", f"{cluster.api_url}/v1/nodes")[1]["nodes"]))["cpu_milli"]
    heavy = [submit(cluster, f"etl{i}", probe(out), cpu_milli=cpu * 6 // 10) for i in range(2)]
    hungry = submit(cluster, "etl-more", probe(out), cpu_milli=cpu * 6 // 10)
    started = [*notebooks, *evals, *heavy, gang]
    views = {j: wait_for(cluster, j, lambda v: v.get("state") == "running", "ran") for j in started}
    message = wait_for(
        cluster, hungry, lambda v: "millicores of CPU" in str(v.get("pending_reason")), "waited for CPU"
    )["pending_reason"]["message"]
    assert f"needs {cpu * 6 // 10} millicores of CPU per task" in message, message

    # the gang: four ranks of four whole GPUs each, none shared with anything else
    held: dict[tuple[str, int], str] = {}
    for p in views[gang]["allocation"]:
        for g in p["gpus"]:
            held[(p["node_id"], g)] = gang
    ranks = seen_by(out, gang, 4)
    assert all(len(r["CUDA_VISIBLE_DEVICES"].split(",")) == 4 for r in ranks), ranks
    assert {g for p in views[gang]["allocation"] for g in p["gpus"]} <= WHOLE
    # the notebooks: one shared whole GPU the gang does not hold, each rank told its share
    shared = {
        (views[nb]["allocation"][0]["node_id"], views[nb]["allocation"][0]["gpus"][0]) for nb in notebooks
    }
    assert len(shared) == 1 and not shared & held.keys() and next(iter(shared))[1] in WHOLE, shared
    for nb in notebooks:
        (env,) = seen_by(out, nb, 1)
        assert env["CUDA_VISIBLE_DEVICES"] == str(next(iter(shared))[1]) and env["RALLY_GPU_MILLI"] == "300"
    # the evals: MIG slices of GPUs 10-11 only, each rank its own MIG device
    for ev in evals:
        assert views[ev]["allocation"][0]["gpus"][0] in (10, 11) and "mig" in views[ev]["allocation"][0]
    devices = [seen_by(out, ev, 1)[0]["CUDA_VISIBLE_DEVICES"] for ev in evals]
    assert all(d.startswith("MIG-") for d in devices) and len(set(devices)) == 3, devices
    # the CPU-heavy jobs: one per node
    assert {views[h]["allocation"][0]["node_id"] for h in heavy} == {"node-1", "node-2"}
    # the team's quota counts each share and slice for its part of a GPU: 16 + 2 whole, three 0.3 shares,
    # 3g + 3g + 2g slices (3, 3 and 2 of seven compute slices: 0.428 + 0.428 + 0.285)
    row = next(t for t in call("GET", f"{cluster.api_url}/v1/queues")[1]["teams"] if t["team"] == "e2e")
    assert row["used"] == pytest.approx(18 + 0.9 + 1.141, abs=1e-9) and row["running_jobs"] == len(started), (
        row
    )

    for job_id in (*started, hungry):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
    for job_id in started:
        wait_for(cluster, job_id, lambda v: v.get("state") == "cancelled", "was cancelled")
    last_seq = log_records(cluster, "e2e-mixed")[-1][0]
    report = verify_decisions(
        asyncio.run(read_history(cluster.nats_url, last_seq)), SchedulingPolicy("rallypoint")
    )
    assert report.ok and report.mismatches == [] and report.refused == [], report
    assert report.verified == report.decisions >= len(started)
