"""Issue 35's workloads on a real local cluster: two agents of 4 simulated GPUs, every service a process.

- a three-stage pipeline whose middle stage fails: the stage after it is ended naming the dependency and
  never runs, a cleanup stage waiting on the failure runs, each dependent is bound promptly after its
  dependency ends;
- an array of 20 members, at most 4 at once: every member completes and sees its own index, and the log
  never has more than 4 members holding GPUs at any position;
- a service survives its rank's crash (restarted after the backoff) and a drain of its node (SIGTERM first,
  then it runs again on the other node); it is never completed or failed; its team reserves 1 GPU for
  services (``service_gpus`` in the queue file), so a second service waits naming the service capacity.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_jobs import job, log_records, submit, wait_for

from rallypoint.events import (
    Event,
    GangBound,
    JobAttemptFailed,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobSuspended,
)
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

#: How long after its dependency's end a dependent may be bound: the scheduler binds it at its next cycle
#: (well under a second here); the margin is for a loaded test machine.
PROMPT_S = 30.0
#: The events after which a job holds no GPU (an array member's slot is free again).
RELEASES = (JobCompleted, JobFailed, JobAttemptFailed, JobPreempted, JobCancelled, JobSuspended)


#: The whole cluster is team e2e's, one of its GPUs reserved for its services.
QUEUES = {"teams": [{"name": "e2e", "nominal": 8, "service_gpus": 1}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    work = tmp_path_factory.mktemp("workloads")
    queues = work / "queues.json"
    queues.write_text(json.dumps(QUEUES))
    with LocalCluster(work / "cluster", nodes=2, gpus_per_node=4, racks=1, queues=queues) as local:
        yield local


def ended(view: dict[str, Any]) -> bool:
    return view.get("state") in ("completed", "failed", "cancelled", "rejected")


def first(records: list[tuple[int, Event]], kind: type[Event], job_id: str) -> Event:
    return next(e for _, e in records if isinstance(e, kind) and getattr(e, "job_id", None) == job_id)


def test_a_pipeline_with_a_failing_middle_stage_ends_its_dependent_and_runs_its_cleanup(
    cluster: LocalCluster,
) -> None:
    prepare = submit(cluster, "prepare", ["true"])
    train = submit(
        cluster, "train", ["sh", "-c", "exit 3"], depends_on=[{"kind": "after-ok", "job_id": prepare}]
    )
    report = submit(cluster, "report", ["true"], depends_on=[{"kind": "after-ok", "job_id": train}])
    cleanup = submit(cluster, "cleanup", ["true"], depends_on=[{"kind": "after-not-ok", "job_id": train}])
    views = {j: wait_for(cluster, j, ended, "ended") for j in (prepare, train, report, cleanup)}
    assert [views[j]["state"] for j in (prepare, train, report, cleanup)] == [
        "completed",
        "failed",
        "failed",
        "completed",
    ], views

    records = log_records(cluster, "workloads-pipeline")
    ended_report = first(records, JobFailed, report)
    assert isinstance(ended_report, JobFailed)
    assert f"dependency can never be met: {train} ended failed (after-ok)" in ended_report.reason
    assert not any(isinstance(e, GangBound) and e.job_id == report for _, e in records), "report never ran"
    # each dependent is bound by the first scheduler cycle that saw its dependency's end: the first decision
    # computed at or after the end's position in the log is its bind (and that within seconds)
    for dependency, end_kind, dependent in ((prepare, JobCompleted, train), (train, JobFailed, cleanup)):
        end_seq, end = next(
            (q, e) for q, e in records if isinstance(e, end_kind) and getattr(e, "job_id", None) == dependency
        )
        decided = [e for _, e in records if getattr(e, "computed_at_seq", -1) >= end_seq]
        bound = decided[0] if decided else None
        assert isinstance(bound, GangBound) and bound.job_id == dependent, (dependency, decided[:3])
        assert isinstance(end, JobCompleted | JobFailed) and 0 <= bound.at - end.at < PROMPT_S, (end, bound)
    assert 0 <= ended_report.at - first(records, JobFailed, train).at < PROMPT_S  # type: ignore[attr-defined]


def test_an_array_of_20_runs_at_most_4_at_once_each_with_its_index(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    script = f'echo "$RALLY_ARRAY_INDEX" > {out}/"$RALLY_JOB_ID"; sleep 1'
    status, answer = call(
        "POST",
        f"{cluster.api_url}/v1/jobs",
        {"name": "sweep", "team": "e2e", "gpus": 1, "command": ["sh", "-c", script], "array": "0-19%4"},
    )
    assert status == 202, answer
    members: list[str] = answer["job_ids"]
    assert members == [f"{answer['array_id']}_{i}" for i in range(20)]
    for member in members:
        assert wait_for(cluster, member, ended, "ended", timeout=180)["state"] == "completed"
    assert {m: (out / m).read_text().strip() for m in members} == {m: m.rsplit("_", 1)[1] for m in members}

    # members holding GPUs at each position of the log: bound until the event that releases them
    holding: set[str] = set()
    peak = 0
    for _, event in log_records(cluster, "workloads-array"):
        member = getattr(event, "job_id", None)
        if member not in members:
            continue
        if isinstance(event, GangBound):
            holding.add(member)
            peak = max(peak, len(holding))
        elif isinstance(event, RELEASES):
            holding.discard(member)
    assert 1 < peak <= 4, peak


def test_a_service_survives_its_ranks_crash_and_a_drain_of_its_node(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)
    # the first attempt crashes; every later one says it is ready once it would record a SIGTERM, and
    # serves until one comes
    script = (
        f"if [ ! -e {out}/crashed ]; then touch {out}/crashed; exit 3; fi; "
        f"trap 'touch {out}/term-$RALLY_ATTEMPT; exit 0' TERM; touch {out}/ready-$RALLY_ATTEMPT; "
        "while :; do sleep 0.2; done"
    )
    service = submit(cluster, "endpoint", ["sh", "-c", script], kind="service")
    serving = wait_for(
        cluster,
        service,
        lambda v: (
            v.get("state") == "running"
            and v["recovery"]["user_failures"] == 1
            and (out / f"ready-{v['attempt']}").exists()
        ),
        "ran again after its crash",
    )
    node = serving["allocation"][0]["node_id"]
    status, answer = call("POST", f"{cluster.api_url}/v1/nodes/{node}/drain", {"reason": "maintenance"})
    assert status == 200, answer
    try:
        plans = {p["job_id"]: p for p in answer["node"]["draining_jobs"]}
        assert plans[service]["plan"] == "now", plans
        moved = wait_for(
            cluster,
            service,
            lambda v: v.get("state") == "running" and v["allocation"][0]["node_id"] != node,
            "ran again on the other node",
        )
        assert (out / f"term-{serving['attempt']}").exists(), "its rank was not stopped with SIGTERM"
    finally:
        call("POST", f"{cluster.api_url}/v1/nodes/{node}/undrain", {"reason": "done"})
    # the team's one reserved GPU is the first service's: a second one waits for that room
    second = submit(cluster, "endpoint-2", ["sleep", "300"], kind="service")
    reason = wait_for(
        cluster, second, lambda v: "service capacity" in str(v.get("pending_reason")), "waited for room"
    )["pending_reason"]
    assert reason["code"] == "QuotaExceeded", reason
    assert "queue e2e's services hold 1 of its 1 reserved GPUs; needs 1 more" in reason["message"], reason
    for each in (service, second):
        call("DELETE", f"{cluster.api_url}/v1/jobs/{each}")
    assert wait_for(cluster, service, ended, "ended")["state"] == "cancelled"
    assert wait_for(cluster, second, ended, "ended")["state"] == "cancelled"

    mine = [e for _, e in log_records(cluster, "workloads-service") if getattr(e, "job_id", None) == service]
    assert not any(isinstance(e, JobCompleted | JobFailed) for e in mine), "a service is never completed"
    crash, drain = (e for e in mine if isinstance(e, JobAttemptFailed))
    assert crash.cause == "user" and "exited with code 3" in crash.reason
    # restarted after its backoff (1 s on a local cluster), not before
    rebound = next(e for e in mine if isinstance(e, GangBound) and e.attempt == crash.attempt + 1)
    assert crash.retry_at > crash.at and rebound.at >= crash.retry_at, (crash, rebound)
    assert drain.cause == "infra" and f"node {node} was drained (maintenance)" in drain.reason
    assert moved["attempt"] == drain.attempt + 1 and job(cluster, service)["state"] == "cancelled"
