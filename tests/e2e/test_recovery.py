"""End to end: jobs survive failures on a real local cluster (6 agents x 8 GPUs in 2 racks of 3).

- a rank exiting non-zero is retried ``max_retries`` times with backoff, then fails naming the attempts;
  a job that exits 0 on its second attempt ends completed;
- a node under a running 2-node gang hangs (its agent and ranks frozen): the gang keeps its healthy node,
  a replacement in the same rack is swapped in, the ranks resume from the last complete checkpoint and
  the final state equals an uninterrupted run's bit for bit; the node answers again, its stale ranks are
  killed and it returns to service;
- preempting a checkpointing job writes a checkpoint before its ranks stop; the requeued job resumes
  from it and the lost work recorded is the time since that checkpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import cluster_jobs
import pytest

from rallypoint.agent import workdir
from rallypoint.audit import verify_decisions
from rallypoint.events import (
    CheckpointCommitted,
    Event,
    GangBound,
    GangRepaired,
    JobCompleted,
    JobInterrupted,
    JobPreempted,
    JobStarted,
    JobSuspended,
    RankExited,
)
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.localcluster.supervisor import local_service_seconds
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

pytestmark = pytest.mark.slow

TERMINAL = {"completed", "failed", "cancelled", "rejected"}
LOCAL_REPAIR_WAIT_S = local_service_seconds("scheduler", "--repair-wait")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("recovery"), nodes=6, gpus_per_node=8, racks=2)
    with local:
        yield local


submit = partial(cluster_jobs.submit)
job = cluster_jobs.job


def wait_for(cluster: LocalCluster, job_id: str, states: set[str], timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError, OSError):
            view = job(cluster, job_id)
        if view.get("state") in states:
            return view
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reached {states}; last seen {view}")


def history(cluster: LocalCluster) -> list[tuple[int, Event]]:
    return cluster_jobs.log_records(cluster, "e2e-recovery")


def of_job(events: list[tuple[int, Event]], job_id: str) -> list[Event]:
    return [e for _, e in events if getattr(e, "job_id", None) == job_id]


# --- retries -----------------------------------------------------------------------------------------


def test_a_failing_rank_is_retried_max_retries_times_with_backoff_then_fails_naming_the_attempts(
    cluster: LocalCluster,
) -> None:
    job_id = submit(cluster, "always-fails", ["sh", "-c", "exit 7"], max_retries=3)
    view = wait_for(cluster, job_id, TERMINAL, timeout=120)
    assert view["state"] == "failed" and view["exit_code"] == 7
    assert view["recovery"]["user_failures"] == 3 and view["attempt"] == 4
    for attempt in range(1, 5):
        assert f"attempt {attempt}: rank 0 exited with code 7" in view["reason"]
    starts = [e.at for e in of_job(history(cluster), job_id) if isinstance(e, JobStarted)]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # the local cluster's backoff is 1 s, doubling: each retry waits at least as long as it says
    assert len(gaps) == 3 and all(gap >= want for gap, want in zip(gaps, (1.0, 2.0, 4.0), strict=True)), gaps


def test_a_job_that_exits_0_on_its_second_attempt_ends_completed(cluster: LocalCluster) -> None:
    job_id = submit(cluster, "flaky", ["sh", "-c", 'test "$RALLY_ATTEMPT" -ge 2'], max_retries=2)
    view = wait_for(cluster, job_id, TERMINAL, timeout=60)
    assert (view["state"], view["attempt"], view["recovery"]["user_failures"]) == ("completed", 2, 1)


# --- a hung node under a running gang ------------------------------------------------------------------


def train_command(steps: int, step_time: float, every: int) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLE),
        "--steps",
        str(steps),
        "--step-time",
        str(step_time),
        "--ckpt-every",
        str(every),
    ]


def uninterrupted(tmp: Path, world: int, steps: int, every: int) -> dict[int, str]:
    """The example run straight through, without Rallypoint: each rank's final state digest."""
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK="0",
            RALLY_JOB_ID="baseline",
            RALLY_ATTEMPT="1",
            RALLY_CHECKPOINT_DIR=str(tmp),
        )
        procs.append(subprocess.Popen(train_command(steps, 0.0, every), env=env))
    assert [p.wait(120) for p in procs] == [0] * world
    return final_digests(tmp, world)


def final_digests(folder: Path, world: int) -> dict[int, str]:
    return {r: (folder / f"final-rank-{r}.sha256").read_text().strip() for r in range(world)}


def live_rank_pids(cluster: LocalCluster, node_id: str, job_id: str, attempt: int) -> list[int]:
    alive = []
    for pid_file in sorted((cluster.workdir / "agents" / node_id / job_id / str(attempt)).glob("rank-*.pid")):
        record = workdir.read_record(pid_file) or {}
        if workdir.same_process(record.get("pid"), record.get("pid_start")):
            alive.append(int(record["pid"]))
    return alive


def has_stepped(cluster: LocalCluster, job_id: str) -> bool:
    """Whether a rank of the job's first attempt has reported a step: its SIGTERM handler is installed by
    then (a rank still importing numpy on a loaded host would die of the signal without a checkpoint)."""
    for report in (cluster.workdir / "agents").glob(f"*/{job_id}/1/rank-*.report"):
        with contextlib.suppress(OSError):
            if b'"step"' in report.read_bytes():
                return True
    return False


def wait_until_stepped(cluster: LocalCluster, job_id: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not has_stepped(cluster, job_id):
        assert time.monotonic() < deadline, f"{job_id} reported no step in {timeout} s"
        time.sleep(0.2)


def test_a_hung_node_is_replaced_in_its_rack_and_the_gang_resumes_to_the_uninterrupted_result(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    steps, every = 60, 5
    job_id = submit(
        cluster,
        "gang",
        train_command(steps, 0.25, every),
        gpus=16,
        gpus_per_task=8,
        ranks_per_task=1,
    )
    view = wait_for(cluster, job_id, {"running"})
    first, second = view["nodes"]
    checkpoints = cluster.checkpoint_root / job_id
    deadline = time.monotonic() + 60
    while not any(checkpoints.glob("step-*/manifest.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = second
    cluster.freeze_node(hung, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        done = wait_for(cluster, job_id, TERMINAL, timeout=120)
    finally:
        cluster.freeze_node(hung, signal.SIGCONT)
    assert done["state"] == "completed", done
    events = history(cluster)
    mine = of_job(events, job_id)
    [interrupted] = [e for e in mine if isinstance(e, JobInterrupted)]
    [repaired] = [e for e in mine if isinstance(e, GangRepaired)]
    assert interrupted.failed_nodes == (hung,) and interrupted.at - frozen_at <= 20
    [swap] = repaired.swaps
    assert swap.from_node == hung and swap.to_node not in (first, second)
    racks = {n["node_id"]: n["rack"] for n in call("GET", f"{cluster.api_url}/v1/nodes")[1]["nodes"]}
    assert racks[swap.to_node] == racks[first], "a free node in the survivor's rack is preferred"
    resumed = [e for e in mine if isinstance(e, JobStarted) and e.attempt == 2]
    assert resumed and resumed[0].resume_step is not None and resumed[0].resume_step >= every
    assert_never_released(events, job_id, first)
    assert final_digests(checkpoints, 2) == uninterrupted(tmp_path / "baseline", 2, steps, every)
    assert done["recovery"]["user_failures"] == 0 and done["recovery"]["infra_failures"] == 1
    # the audit finds the live repair again: the fold at its sequence, the scheduler's repair rule
    report = verify_decisions(events, SchedulingPolicy("rallypoint"), repair_wait_s=LOCAL_REPAIR_WAIT_S)
    assert report.repairs >= 1 and report.repairs_verified == report.repairs, report
    assert report.ok, report

    # the hung node answers again: back in service, and the ranks it still ran for attempt 1 are killed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = {n["node_id"]: n for n in call("GET", f"{cluster.api_url}/v1/nodes")[1]["nodes"]}
        if nodes[hung]["status"] == "up" and not live_rank_pids(cluster, hung, job_id, 1):
            break
        time.sleep(0.5)
    assert nodes[hung]["status"] == "up"
    assert live_rank_pids(cluster, hung, job_id, 1) == []


def assert_never_released(events: list[tuple[int, Event]], job_id: str, node_id: str) -> None:
    """From the first bind to completion, the survivor's GPUs belong to the job at every sequence."""
    state = ClusterState()
    holding = False
    for seq, event in events:
        state.apply(seq, event)
        if isinstance(event, GangBound) and event.job_id == job_id:
            holding = True
        if isinstance(event, JobCompleted) and event.job_id == job_id:
            return
        if holding:
            assert job_id in state.nodes[node_id].allocated.values(), f"released at seq {seq} ({event})"
    raise AssertionError("the job never completed in the log")


# --- checkpoint-aware preemption ------------------------------------------------------------------------


def test_a_preempted_job_checkpoints_before_its_ranks_stop_and_resumes_from_it(cluster: LocalCluster) -> None:
    steps, every = 2000, 100000  # checkpoints only when told to stop
    fillers = [
        submit(
            cluster,
            f"filler-{i}",
            train_command(steps, 0.05, every),
            gpus=8,
            gpus_per_task=8,
            priority="best-effort",
        )
        for i in range(6)
    ]
    for filler in fillers:
        wait_for(cluster, filler, {"running"})
        wait_until_stepped(cluster, filler)
    urgent = submit(
        cluster, "urgent", ["sh", "-c", "sleep 1"], gpus=8, gpus_per_task=8, priority="production"
    )
    assert wait_for(cluster, urgent, TERMINAL)["state"] == "completed"
    events = history(cluster)
    [victim] = [f for f in fillers if any(isinstance(e, JobPreempted) for e in of_job(events, f))]
    mine = of_job(events, victim)
    kinds = [type(e).__name__ for e in mine]
    commits = [e for e in mine if isinstance(e, CheckpointCommitted) and e.attempt == 1]
    assert commits, f"attempt 1 committed no checkpoint: {kinds}"
    commit = commits[0]
    exit_index = next(i for i, e in enumerate(mine) if isinstance(e, RankExited) and e.attempt == 1)
    assert mine.index(commit) < exit_index, kinds
    [preempted] = [e for e in mine if isinstance(e, JobPreempted)]
    assert preempted.checkpoint_step == commit.step
    assert preempted.lost_gpu_s == pytest.approx(8 * (preempted.at - commit.at), abs=0.01)
    assert preempted.lost_gpu_s < 8 * 5.0, "only the seconds since the checkpoint are lost"
    view = wait_for(cluster, victim, {"running", "completed"})
    restarted = [e for e in of_job(history(cluster), victim) if isinstance(e, JobStarted) and e.attempt == 2]
    assert restarted and restarted[0].resume_step == commit.step, view
    for filler in fillers:
        call("DELETE", f"{cluster.api_url}/v1/jobs/{filler}")
    for filler in fillers:
        wait_for(cluster, filler, TERMINAL, timeout=60)


# --- suspend and resume (issue 35) ------------------------------------------------------------------------


def test_a_suspended_gang_checkpoints_frees_its_gpus_and_resumes_from_its_step(cluster: LocalCluster) -> None:
    steps, every = 2000, 100000  # checkpoints only when told to stop
    job_id = submit(cluster, "suspendable", train_command(steps, 0.05, every), gpus=8, gpus_per_task=8)
    wait_for(cluster, job_id, {"running"})
    wait_until_stepped(cluster, job_id)
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs/{job_id}/suspend")
    assert status == 202 and answer["suspend_requested"], answer
    status, again = call("POST", f"{cluster.api_url}/v1/jobs/{job_id}/suspend")
    assert status == 409, again  # already being suspended
    view = wait_for(cluster, job_id, {"suspended"})
    assert view["allocation"] == [] and view["nodes"] == []
    mine = of_job(history(cluster), job_id)
    commits = [e for e in mine if isinstance(e, CheckpointCommitted) and e.attempt == 1]
    [suspended] = [e for e in mine if isinstance(e, JobSuspended)]
    assert commits and suspended.attempt == 1 and suspended.checkpoint_step == commits[-1].step
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs/{job_id}/resume")
    assert status == 202 and answer["state"] in ("pending", "bound", "running"), answer
    view = wait_for(cluster, job_id, {"running", "completed"})
    assert view["suspended_s"] > 0, view
    restarted = [e for e in of_job(history(cluster), job_id) if isinstance(e, JobStarted) and e.attempt == 2]
    assert restarted and restarted[0].resume_step == suspended.checkpoint_step, view
    call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
    wait_for(cluster, job_id, TERMINAL, timeout=60)
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs/{job_id}/resume")
    assert status == 409 and answer["state"] == "cancelled", answer


# --- services (issue 35) -----------------------------------------------------------------------------------


def test_a_service_survives_its_ranks_crash_and_runs_until_cancelled(cluster: LocalCluster) -> None:
    # each attempt's rank runs a second and crashes; the service starts again each time (local backoff 1 s)
    service = submit(
        cluster, "endpoint", ["sh", "-c", "sleep 1; exit 3"], kind="service", priority="best-effort"
    )
    deadline = time.monotonic() + 90
    view = job(cluster, service)
    while (
        not (view["attempt"] >= 3 and view["state"] in ("bound", "running")) and time.monotonic() < deadline
    ):
        time.sleep(0.3)
        view = job(cluster, service)
    assert view["attempt"] >= 3 and view["state"] in ("bound", "running"), view
    assert view["spec"]["kind"] == "service" and view["recovery"]["user_failures"] >= 2, view
    call("DELETE", f"{cluster.api_url}/v1/jobs/{service}")
    assert wait_for(cluster, service, TERMINAL, timeout=60)["state"] == "cancelled"
