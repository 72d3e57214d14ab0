"""Placement rules on a real local cluster (issue 35 item 6): three racks of one node each, the third node's
agent started with ``--taint pool=serve``.

Three replicas of a service with rack anti-affinity land in three different racks (the one that tolerates
the taint may take the tainted node); a fourth waits with a reason naming the rule, and starts once a
replica in another rack is cancelled. Batch jobs without the toleration never land on the tainted node
even while it has free GPUs. The whole log then audits clean.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_jobs import job, log_records, submit, wait_for

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.scheduling import SchedulingPolicy

pytestmark = pytest.mark.slow

SLEEP = ["sleep", "300"]
WEB = [{"group": "web", "level": "rack", "anti": True}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("rules"),
        nodes=3,
        gpus_per_node=2,
        racks=3,
        agent_args={2: ("--taint", "pool=serve")},
    )
    with local:
        yield local


def running(view: dict[str, Any]) -> bool:
    return bool(view["state"] == "running")


def reason(view: dict[str, Any]) -> str:
    """The scheduler's reason for a waiting job, as ``CODE: message`` ("" when it has none)."""
    why = view.get("pending_reason") or {}
    return f"{why.get('code')}: {why.get('message')}" if why else ""


def test_replicas_spread_over_racks_and_only_tolerating_jobs_use_the_tainted_node(
    cluster: LocalCluster,
) -> None:
    status, nodes = call("GET", f"{cluster.api_url}/v1/nodes")
    assert status == 200, nodes
    taints = {n["node_id"]: n["taints"] for n in nodes["nodes"]}
    tainted = [n for n, t in taints.items() if t == ["pool=serve"]]
    assert len(tainted) == 1, taints
    rack_of = {n["node_id"]: n["rack"] for n in nodes["nodes"]}

    replicas = [
        submit(cluster, f"web-{i}", SLEEP, kind="service", affinity=WEB, tolerations=["pool"])
        for i in range(3)
    ]
    placed = [wait_for(cluster, r, running, "replica running") for r in replicas]
    racks = [rack_of[v["nodes"][0]] for v in placed]
    assert sorted(racks) == sorted(set(rack_of.values())), racks  # one per rack, the tainted one included

    fourth = submit(cluster, "web-3", SLEEP, kind="service", affinity=WEB, tolerations=["pool"])
    wait_for(cluster, fourth, lambda v: "anti-affinity web:rack" in reason(v), "a reason naming the rule")

    # batch jobs: two take the free GPU of each untainted node; the third waits though the tainted node
    # has one free
    batch = [submit(cluster, f"batch-{i}", SLEEP) for i in range(3)]
    ran = [wait_for(cluster, b, running, "batch running") for b in batch[:2]]
    assert all(v["nodes"][0] not in tainted for v in ran), ran
    left = wait_for(cluster, batch[2], lambda v: reason(v).startswith("Resources"), "waits for room")
    assert left["state"] == "pending" and not left["nodes"], left

    # a replica in an untainted rack is cancelled: the fourth takes its rack
    gone = next(v for v in placed if v["nodes"][0] not in tainted)
    assert call("DELETE", f"{cluster.api_url}/v1/jobs/{gone['job_id']}")[0] in (200, 202)
    started = wait_for(cluster, fourth, running, "the fourth replica running after a cancel")
    assert rack_of[started["nodes"][0]] == rack_of[gone["nodes"][0]], (started, gone)

    live = [*replicas, fourth, *batch]
    for job_id in live:
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
    for job_id in live:
        wait_for(cluster, job_id, lambda v: v.get("state") == "cancelled", "was cancelled")
    last_seq = log_records(cluster, "e2e-rules")[-1][0]
    report = verify_decisions(
        asyncio.run(read_history(cluster.nats_url, last_seq)), SchedulingPolicy("rallypoint")
    )
    assert report.ok and report.mismatches == [] and report.refused == [], report
    assert job(cluster, fourth)["state"] == "cancelled"


def test_an_operator_taints_a_node_through_the_api_and_new_jobs_keep_off_it(cluster: LocalCluster) -> None:
    url = f"{cluster.api_url}/v1/nodes/node-1/rules"
    status, refused = call("PUT", url, {"taints": ["maint"]}, token=cluster.token_for("nlp"))
    assert status == 403, refused  # a team's token may not
    status, bad = call("PUT", url, {"taints": ["a b"]})
    assert status == 422 and bad["field"] == "taints[0]", bad
    status, done = call("PUT", url, {"labels": {"zone": "x"}, "taints": ["maint"]})
    assert status == 200 and done["node"]["taints"] == ["maint"] and done["node"]["labels"] == {"zone": "x"}

    # node-1 alone is labelled zone=x, and it is tainted: a selecting job waits until it tolerates
    held = submit(cluster, "held", SLEEP, node_selector={"zone": "x"})
    wait_for(cluster, held, lambda v: "maint" in reason(v), "waits naming the taint")
    welcome = submit(cluster, "welcome", SLEEP, node_selector={"zone": "x"}, tolerations=["maint"])
    assert wait_for(cluster, welcome, running, "runs on node-1")["nodes"] == ["node-1"]

    status, cleared = call("PUT", url, {})  # the operator's set cleared: node-1 takes anyone again
    assert status == 200 and cleared["node"]["taints"] == [] and "zone" not in cleared["node"]["labels"]
    for job_id in (held, welcome):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")


def test_a_higher_job_with_a_selector_preempts_a_lower_one_on_the_node_it_selects(
    cluster: LocalCluster,
) -> None:
    url = f"{cluster.api_url}/v1/nodes/node-2/rules"
    assert call("PUT", url, {"labels": {"zone": "y"}})[0] == 200
    low = submit(
        cluster, "low", SLEEP, gpus=2, gpus_per_task=2, node_selector={"zone": "y"}, priority="best-effort"
    )
    assert wait_for(cluster, low, running, "the low job runs on node-2")["nodes"] == ["node-2"]
    high = submit(
        cluster, "high", SLEEP, gpus=2, gpus_per_task=2, node_selector={"zone": "y"}, priority="training-high"
    )
    assert wait_for(cluster, high, running, "the high job runs after preempting", timeout=120)["nodes"] == [
        "node-2"
    ]
    assert job(cluster, low)["state"] == "pending"  # requeued, waiting for node-2 again
    assert call("PUT", url, {})[0] == 200
    for job_id in (low, high):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
