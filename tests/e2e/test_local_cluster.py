"""End to end on a real local cluster: NATS, PostgreSQL, every service its own process, 4 agents x 8 GPUs.

One cluster serves the whole module (starting it costs seconds); each test submits its own jobs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import cluster_jobs
import msgspec
import pytest

from rallypoint.cli.replay import replay_state
from rallypoint.eventlog import EventLog
from rallypoint.events import GangBound, JobCompleted, JobStarted, JobSubmitted, RankExited, subjects
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.state import ClusterState

pytestmark = pytest.mark.slow

TERMINAL = {"completed", "failed", "cancelled", "rejected"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Frequent snapshots, so the kill -9 restarts below start from a snapshot plus the log's tail.
    env = dict(os.environ, RALLY_SNAPSHOT_EVERY="10", RALLY_SNAPSHOT_CHECK_S="1")
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=4, gpus_per_node=8, racks=2, env=env)
    with local:
        yield local


@pytest.fixture
def probes(cluster: LocalCluster, tmp_path: Path) -> Path:
    # where ranks, which run as an unprivileged user in a sandbox, may write (issue 30)
    return cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)


def submit(
    cluster: LocalCluster,
    name: str,
    gpus: int,
    per_task: int,
    probes: Path,
    *,
    sleep: float = 0.5,
    exit_code: int = 0,
    ranks_per_task: int | None = None,
) -> str:
    command = [
        sys.executable,
        "-m",
        "rallypoint.localcluster.rankprobe",
        "--out",
        str(probes),
        "--sleep",
        str(sleep),
        "--exit",
        str(exit_code),
    ]
    body = {
        "name": name,
        "team": "e2e",
        "gpus": gpus,
        "gpus_per_task": per_task,
        "ranks_per_task": ranks_per_task or per_task,
        "command": command,
    }
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


job = cluster_jobs.job


def wait_state(cluster: LocalCluster, job_id: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            view = job(cluster, job_id)
        except (AssertionError, OSError):
            view = {}
        if view.get("state") in states:
            return view
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reached {states}; last seen {view}")


def events_of(cluster: LocalCluster, job_id: str) -> list[Any]:
    async def read() -> list[Any]:
        log = await EventLog.connect(cluster.nats_url, name="e2e-reader", create=False)
        try:
            return [
                msgspec.structs.replace(rec, event=event)
                async for rec in log.replay()
                for event in subjects.members(rec.event)  # a GangsBound's binds, each the job's own
                if getattr(event, "job_id", None) == job_id
            ]
        finally:
            await log.close()

    return asyncio.run(read())


def test_a_16_gpu_gang_starts_whole_and_each_rank_sees_its_own_gpus(
    cluster: LocalCluster, probes: Path
) -> None:
    job_id = submit(cluster, "gang", 16, 8, probes, sleep=1.0)
    view = wait_state(cluster, job_id, TERMINAL)
    assert view["state"] == "completed"

    allocation = view["allocation"]
    assert len(allocation) == 2 and sum(len(t["gpus"]) for t in allocation) == 16
    assert len({t["node_id"] for t in allocation}) == 2

    records = events_of(cluster, job_id)
    kinds = [type(r.event) for r in records]
    # The lifecycle, in order: submitted, bound (whole gang in one event), started, 16 exits, completed.
    assert kinds[0] is JobSubmitted
    assert kinds.index(GangBound) < kinds.index(JobStarted) < kinds.index(JobCompleted)
    assert kinds.count(GangBound) == 1 and kinds.count(RankExited) == 16
    bind = next(r for r in records if isinstance(r.event, GangBound))
    first_exit = min(r.seq for r in records if isinstance(r.event, RankExited))
    assert bind.seq < first_exit

    seen = [json.loads(p.read_text()) for p in sorted(probes.glob(f"{job_id}-rank*.json"))]
    assert sorted(int(s["RANK"]) for s in seen) == list(range(16))
    # Ranks started only after the whole gang was bound: no rank ran on a partial allocation.
    bound_at = bind.event.at
    assert all(float(s["started"]) >= bound_at for s in seen)
    by_rank = {int(s["RANK"]): s for s in seen}
    placements = {p.task: p for p in bind.event.placements}
    for rank, s in by_rank.items():
        task = rank // 8
        assert s["WORLD_SIZE"] == "16" and s["LOCAL_WORLD_SIZE"] == "8"
        assert s["NODE_RANK"] == str(task) and s["LOCAL_RANK"] == str(rank % 8)
        assert s["CUDA_VISIBLE_DEVICES"] == str(placements[task].gpus[rank % 8])
        assert s["RALLY_JOB_ID"] == job_id
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1


def test_a_failing_rank_fails_the_job_and_a_cancel_stops_a_running_one(
    cluster: LocalCluster, probes: Path
) -> None:
    failing = submit(cluster, "fails", 2, 2, probes, exit_code=3)
    sleeper = submit(cluster, "sleeper", 4, 4, probes, sleep=300)
    view = wait_state(cluster, failing, TERMINAL)
    assert view["state"] == "failed" and view["exit_code"] == 3
    wait_state(cluster, sleeper, {"running"})
    status, _ = call("DELETE", f"{cluster.api_url}/v1/jobs/{sleeper}")
    assert status == 202
    assert wait_state(cluster, sleeper, TERMINAL, timeout=30)["state"] == "cancelled"


def quiescent_seq(cluster: LocalCluster, timeout: float = 30.0) -> tuple[int, str]:
    """The API's (seq, hash) once two reads in a row agree: nothing is being written."""
    deadline = time.monotonic() + timeout
    previous: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        status, body = call("GET", f"{cluster.api_url}/v1/state")
        assert status == 200
        current = (int(body["seq"]), str(body["hash"]))
        if current == previous:
            return current
        previous = current
        time.sleep(1.0)
    raise AssertionError("the log never went quiet")


def test_the_background_services_yield_the_cpu_to_those_a_job_waits_on(cluster: LocalCluster) -> None:
    # runtime.priority: each service sets its own niceness as it starts (ours is the floor: a niced test
    # run starts them niced)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    niceness = {name: os.getpriority(os.PRIO_PROCESS, p.pid) for name, p in cluster.processes.items()}
    background = {"projector", "preemption"}
    assert background <= niceness.keys()
    assert {name: niceness[name] for name in background} == dict.fromkeys(background, max(own, 10))
    waited_on = ("api", "job-controller", "health-monitor", "checkpoint", "predictor", "inventory")
    assert {name: niceness[name] for name in waited_on} == dict.fromkeys(waited_on, own)
    assert niceness["scheduler-1"] == niceness["scheduler-2"] == own


def test_replay_from_zero_gives_the_live_state_hash(cluster: LocalCluster, probes: Path) -> None:
    wait_state(cluster, submit(cluster, "for-replay", 3, 3, probes), TERMINAL)
    seq, live_hash = quiescent_seq(cluster)
    replayed = asyncio.run(replay_state(cluster.nats_url, seq))
    assert replayed["seq"] == seq
    assert replayed["hash"] == live_hash


def test_the_postgres_projection_matches_the_log(cluster: LocalCluster, probes: Path) -> None:
    wait_state(cluster, submit(cluster, "for-projection", 2, 2, probes), TERMINAL)
    seq, _ = quiescent_seq(cluster)

    async def compare() -> None:
        state = ClusterState()
        log = await EventLog.connect(cluster.nats_url, name="e2e-proj", create=False)
        try:
            async for rec in log.replay(to_seq=seq):
                state.apply(rec.seq, rec.event)
        finally:
            await log.close()
        conn = await asyncpg.connect(cluster.postgres_dsn)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                position = await conn.fetchval("SELECT max(seq) FROM rally.projection_position")
                if position is not None and position >= seq:
                    break
                await asyncio.sleep(0.3)
            rows = await conn.fetch("SELECT job_id, state FROM rally.jobs")
            archived = await conn.fetchval("SELECT count(*) FROM rally.events WHERE seq <= $1", seq)
        finally:
            await conn.close()
        assert {r["job_id"]: r["state"] for r in rows} == {j.job_id: j.state for j in state.jobs.values()}
        assert archived == seq

    asyncio.run(compare())


RESTARTABLE = (
    "job-controller",
    "api",
    "inventory",
    "health-monitor",
    "projector",
    "preemption",
    "checkpoint",
    "agent-node-1",
)


#: The services that save snapshots of their fold (every 10 events here, checked each second).
SNAPSHOTTING = ("job-controller", "api", "inventory", "preemption", "checkpoint")


def _wait_for_a_snapshot(cluster: LocalCluster, service: str) -> None:
    """Until ``service`` has saved a snapshot: on a loaded machine (or with this case run alone) the kill
    could otherwise come before its first save, and the restart would rightly replay the whole log."""
    log_file = cluster.workdir / "logs" / f"{service}.log"
    deadline = time.monotonic() + 120
    while "saved snapshot at seq" not in log_file.read_text():
        assert time.monotonic() < deadline, f"{service} saved no snapshot in 120 s"
        time.sleep(0.2)


def _restored_from_a_snapshot(cluster: LocalCluster, service: str) -> bool:
    """Whether ``service``'s restarted process says it restored its fold from a snapshot, waiting for it:
    the job may complete while the restarted process is still importing on a loaded machine. (Each of
    these services is killed once, and the module's cluster starts with no snapshot.)"""
    log_file = cluster.workdir / "logs" / f"{service}.log"
    deadline = time.monotonic() + 120
    while "restored state at seq" not in log_file.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("service", RESTARTABLE)
def test_kill_9_of_a_service_while_jobs_run_then_restart(
    cluster: LocalCluster, probes: Path, service: str
) -> None:
    running = submit(cluster, f"survive-{service}", 8, 8, probes, sleep=3.0)
    wait_state(cluster, running, {"running"})
    if service in SNAPSHOTTING:
        _wait_for_a_snapshot(cluster, service)
    cluster.kill(service, signal.SIGKILL)
    queued_meanwhile = None
    if service != "api":
        queued_meanwhile = submit(cluster, f"meanwhile-{service}", 1, 1, probes, sleep=0.2)
    cluster.restart(service)
    assert wait_state(cluster, running, TERMINAL, timeout=60)["state"] == "completed"
    if service in SNAPSHOTTING:
        assert _restored_from_a_snapshot(cluster, service), "the restarted service started from a snapshot"
    if service == "health-monitor":  # it folds the nodes' events alone: replayed, no snapshot
        log_text = (cluster.workdir / "logs" / f"{service}.log").read_text()
        assert "caught up on rally.node.> (this fold reads those subjects only)" in log_text
        assert "restored state at seq" not in log_text
    if queued_meanwhile is not None:
        assert wait_state(cluster, queued_meanwhile, TERMINAL, timeout=60)["state"] == "completed"
    assert not cluster.dead_services()


def test_killing_the_scheduler_leader_hands_over_to_the_standby(cluster: LocalCluster, probes: Path) -> None:
    quiescent_seq(cluster)
    before = asyncio.run(_leader(cluster))
    leader_name = before["leader_id"]
    assert leader_name in ("scheduler-1", "scheduler-2")
    cluster.kill(leader_name, signal.SIGKILL)
    job_id = submit(cluster, "after-failover", 4, 4, probes)
    assert wait_state(cluster, job_id, TERMINAL, timeout=60)["state"] == "completed"
    after = asyncio.run(_leader(cluster))
    assert after["epoch"] > before["epoch"]
    assert after["leader_id"] != leader_name
    cluster.restart(leader_name)


async def _leader(cluster: LocalCluster) -> dict[str, Any]:
    state = ClusterState()
    log = await EventLog.connect(cluster.nats_url, name="e2e-leader", create=False)
    try:
        async for rec in log.replay():
            state.apply(rec.seq, rec.event)
    finally:
        await log.close()
    return {"epoch": state.epoch, "leader_id": state.leader_id}


def test_a_production_gang_preempts_best_effort_work_which_is_requeued(
    cluster: LocalCluster, probes: Path
) -> None:
    def submit_with(name: str, gpus: int, priority: str, sleep: float) -> str:
        command = [
            sys.executable,
            "-m",
            "rallypoint.localcluster.rankprobe",
            "--out",
            str(probes),
            "--sleep",
            str(sleep),
        ]
        body = {
            "name": name,
            "team": "e2e",
            "gpus": gpus,
            "gpus_per_task": 8,
            "ranks_per_task": 1,
            "priority": priority,
            "command": command,
        }
        status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
        assert status == 202, answer
        return str(answer["job_id"])

    fillers = [submit_with(f"filler-{i}", 8, "best-effort", 300) for i in range(4)]
    for filler in fillers:
        wait_state(cluster, filler, {"running"})
    urgent = submit_with("urgent", 16, "production", 0.5)
    assert wait_state(cluster, urgent, TERMINAL, timeout=90)["state"] == "completed"

    preempted = [f for f in fillers if job(cluster, f)["preemptions"] >= 1]
    assert len(preempted) == 2, "exactly the two victims that free 16 GPUs are preempted"
    for victim in preempted:
        kinds = [type(r.event).__name__ for r in events_of(cluster, victim)]
        assert kinds.index("PreemptionRequested") < kinds.index("JobPreempted")
        # Requeued, then bound again as a new attempt once the urgent job is done.
        assert kinds.count("GangBound") == 2
        wait_state(cluster, victim, {"running"})
    for filler in fillers:
        call("DELETE", f"{cluster.api_url}/v1/jobs/{filler}")
    for filler in fillers:
        assert wait_state(cluster, filler, TERMINAL, timeout=60)["state"] == "cancelled"


def test_every_recorded_decision_recomputes_identically_from_the_log(
    cluster: LocalCluster, probes: Path
) -> None:
    from rallypoint.audit import verify_decisions
    from rallypoint.cli.replay import read_history
    from rallypoint.scheduling import SchedulingPolicy

    wait_state(cluster, submit(cluster, "audited", 8, 8, probes), TERMINAL)
    seq, live_hash = quiescent_seq(cluster)
    report = verify_decisions(
        asyncio.run(read_history(cluster.nats_url, seq)), SchedulingPolicy("rallypoint")
    )
    assert report.decisions > 0 and report.other_policy == 0
    assert report.mismatches == []
    assert report.verified == report.decisions
    assert report.final_hash == live_hash
