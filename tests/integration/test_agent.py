"""The node agent as its own process against a real NATS server: register, heartbeat, launch, kill, report.

The agent runs as ``python -m rallypoint_services.agent`` (what ``rally serve agent`` runs), so these
tests also cover its command line, signal handling and crash recovery with a real SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from rallypoint.agent import EXIT_LOST, RankLauncher, SimulatedGpus
from rallypoint.agent.node import AgentConfig, NodeAgent
from rallypoint.agent.reaper import zombie_children
from rallypoint.agent.workdir import read_record
from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import CheckpointCommitted, NodeRegistered, RankExited, subjects
from rallypoint.infra import ManagedProcess, NatsServer
from rallypoint.protocol import (
    Heartbeat,
    KillReply,
    KillTask,
    LaunchReply,
    LaunchTask,
    RankSpec,
    StatusReply,
)

PY = sys.executable
NODE = "node-1"


# Makes the process a child subreaper, then execs the rest of its arguments: the agent then adopts
# orphans the way it does as PID 1 of its container (the attribute survives exec).
AS_SUBREAPER = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class Agent:
    """One agent process; ``stop()`` is SIGTERM, ``crash()`` SIGKILL."""

    def __init__(
        self, url: str, work_dir: Path, log_path: Path, *extra: str, subreaper: bool = False
    ) -> None:
        argv = [
            PY,
            *(("-c", AS_SUBREAPER) if subreaper else ()),
            "-m",
            "rallypoint_services.agent",
            "--nats-url",
            url,
            "--node-id",
            NODE,
            "--rack",
            "rack-3",
            "--spine",
            "spine-1",
            "--gpus",
            "4",
            "--nvlink-domain-size",
            "2",
            "--gpu-type",
            "sim-h100",
            "--backend",
            "sim",
            "--address",
            "127.0.0.1",
            "--work-dir",
            str(work_dir),
            "--heartbeat-interval",
            "0.2",
            "--log-format",
            "text",
            *extra,
        ]
        self.proc = ManagedProcess(argv, log_path=log_path)

    async def stop(self) -> int | None:
        return await asyncio.to_thread(self.proc.stop, 10.0)

    async def crash(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(self.proc.popen.wait, 5.0)


@pytest.fixture
async def agent_env(
    event_log: EventLog, nats_server: NatsServer, tmp_path: Path
) -> AsyncIterator[Callable[..., Agent]]:
    started: list[Agent] = []
    work_dir = tmp_path / "work"
    # The folder the ranks and the test share: ranks run as an unprivileged user and see, of tmp_path
    # (0700), only what their sandbox shows them (issue 30)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)

    def start(*extra: str, subreaper: bool = False) -> Agent:
        log_path = tmp_path / f"agent-{len(started)}.log"
        agent = Agent(
            nats_server.url, work_dir, log_path, "--rank-path", str(shared), *extra, subreaper=subreaper
        )
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            await agent.stop()
        # Ranks outlive agents by design; the test must not leave them behind.
        for pid_file in work_dir.rglob("rank-*.pid"):
            record = read_record(pid_file) or {}
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(record.get("pid"), signal.SIGKILL)  # type: ignore[arg-type]


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def events_on(log: EventLog, subject: str) -> list[object]:
    if await log.last_seq(subject) == 0:
        return []
    return [rec.event async for rec in log.replay(subjects=subject) if isinstance(rec, Recorded)]


async def rank_exits(log: EventLog, job_id: str, node_id: str = NODE) -> dict[int, int]:
    events = await events_on(log, subjects.agent_job(node_id, job_id))
    return {e.rank: e.exit_code for e in events if isinstance(e, RankExited)}


async def first_heartbeat(log: EventLog, timeout: float = 60.0) -> Heartbeat:
    sub = await log.nc.subscribe(subjects.heartbeat(NODE))
    try:
        msg = await sub.next_msg(timeout=timeout)
    finally:
        await sub.unsubscribe()
    return msgspec.json.decode(msg.data, type=Heartbeat)


def _span(rank: int, width: int) -> tuple[int, ...]:
    return tuple(range(rank * width, (rank + 1) * width))


def task(job_id: str, command: list[str], *, ranks: int = 2, gpus_per_rank: int = 1) -> LaunchTask:
    return LaunchTask(
        job_id=job_id,
        attempt=0,
        node_id=NODE,
        node_rank=0,
        world_size=ranks,
        local_world_size=ranks,
        master_addr="127.0.0.1",
        master_port=29500,
        command=tuple(command),
        ranks=tuple(RankSpec(rank=r, local_rank=r, gpus=_span(r, gpus_per_rank)) for r in range(ranks)),
    )


async def request(log: EventLog, verb: str, payload: msgspec.Struct | None) -> bytes:
    data = msgspec.json.encode(payload) if payload is not None else b""
    msg = await log.nc.request(subjects.agent_command(NODE, verb), data, timeout=60.0)
    return msg.data


async def launch(log: EventLog, launch_task: LaunchTask) -> LaunchReply:
    return msgspec.json.decode(await request(log, "launch", launch_task), type=LaunchReply)


async def test_agent_registers_heartbeats_launches_reports_and_kills(
    event_log: EventLog, agent_env: Callable[..., Agent], tmp_path: Path
) -> None:
    agent_env()
    beat = await first_heartbeat(event_log)
    assert beat.node_id == NODE and len(beat.gpus) == 4 and beat.ranks == ()

    [registered] = await events_on(event_log, subjects.node_registration(NODE))
    assert isinstance(registered, NodeRegistered)
    assert (registered.rack, registered.spine, registered.gpu_type) == ("rack-3", "spine-1", "sim-h100")
    assert [g.nvlink_domain for g in registered.gpus] == [0, 0, 1, 1]
    assert registered.agent_instance == beat.agent_instance

    # Rank r exits with r: one success, one failure, both reported with their codes.
    exit_with_rank = [PY, "-c", "import os, sys; sys.exit(int(os.environ['RANK']))"]
    reply = await launch(event_log, task("job-1", exit_with_rank))
    assert reply.ok and reply.started == (0, 1) and not reply.already_running
    await wait_until(lambda: _has(rank_exits(event_log, "job-1"), 2), "RankExited for job-1")
    assert await rank_exits(event_log, "job-1") == {0: 0, 1: 1}
    job_events = await events_on(event_log, subjects.agent_job(NODE, "job-1"))
    assert all(isinstance(e, RankExited) and e.node_id == NODE for e in job_events)

    # A resent launch is answered, not re-run.
    again = await launch(event_log, task("job-1", exit_with_rank))
    assert again.ok and again.already_running

    # A long rank shows in heartbeats and status until it is killed; the kill is reported as SIGTERM.
    sleeper = task("job-2", [PY, "-c", "import time; time.sleep(60)"], ranks=1, gpus_per_rank=2)
    assert (await launch(event_log, sleeper)).ok
    status = msgspec.json.decode(await request(event_log, "status", None), type=StatusReply)
    assert {(r.job_id, r.rank) for r in status.ranks} >= {("job-2", 0), ("job-1", 0), ("job-1", 1)}

    async def busy_beat() -> bool:
        beat = await first_heartbeat(event_log)
        return any(r.job_id == "job-2" for r in beat.ranks) and beat.gpus[0].utilization > 0

    await wait_until(busy_beat, "a heartbeat with job-2 running")

    kill = KillTask(job_id="job-2", attempt=0, grace_s=5)
    killed = msgspec.json.decode(await request(event_log, "kill", kill), type=KillReply)
    assert killed.ok and killed.signalled == 1
    await wait_until(lambda: _has(rank_exits(event_log, "job-2"), 1), "RankExited for job-2")
    assert await rank_exits(event_log, "job-2") == {0: 128 + signal.SIGTERM}

    # Bad requests get an error reply, not silence.
    bad = msgspec.json.decode(await request(event_log, "launch", None), type=LaunchReply)
    assert not bad.ok and "LaunchTask" in bad.error
    wrong_gpu = task("job-3", exit_with_rank, ranks=1, gpus_per_rank=8)
    refused = await launch(event_log, wrong_gpu)
    assert not refused.ok and "no such GPUs" in refused.error


async def test_exit_during_an_agent_crash_is_reported_by_the_next_agent(
    event_log: EventLog, agent_env: Callable[..., Agent], tmp_path: Path
) -> None:
    first = agent_env()
    beat = await first_heartbeat(event_log)
    go = tmp_path / "shared" / "go"
    wait_then_exit = [
        PY,
        "-c",
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
        "sys.exit(int(os.environ['RANK']) + 3)",
        str(go),
    ]
    reply = await launch(event_log, task("job-9", wait_then_exit))
    assert reply.started == (0, 1)

    await first.crash()
    go.write_text("")  # the ranks finish while no agent is running
    await asyncio.sleep(0.3)
    assert await rank_exits(event_log, "job-9") == {}

    agent_env()
    await wait_until(lambda: _has(rank_exits(event_log, "job-9"), 2), "RankExited after restart")
    assert await rank_exits(event_log, "job-9") == {0: 3, 1: 4}
    node_events = await events_on(event_log, subjects.node_registration(NODE))
    registrations = [e for e in node_events if isinstance(e, NodeRegistered)]
    assert len(registrations) == 2
    assert registrations[0].agent_instance == beat.agent_instance != registrations[1].agent_instance

    # The restarted agent still refuses to start the same ranks again.
    again = await launch(event_log, task("job-9", wait_then_exit))
    assert again.already_running


async def _has(exits: Awaitable[dict[int, int]], count: int) -> bool:
    return len(await exits) >= count


async def test_appends_are_retried_until_the_log_answers(tmp_path: Path) -> None:
    """A real outage: the agent's NATS server is down while it registers and again while a rank exits."""
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="agent-outage")
    launcher = RankLauncher(tmp_path / "work")
    config = AgentConfig(node_id="node-7", heartbeat_interval_s=0.1, poll_interval_s=0.05)
    agent = NodeAgent(log, SimulatedGpus("node-7", 2), launcher, config)
    try:
        await server.astop(remove_data=False)
        starting = asyncio.create_task(agent.start())
        await asyncio.sleep(1.5)
        assert not starting.done(), "registration cannot land while the server is down"
        await server.astart()  # same port, same store: the client reconnects
        await asyncio.wait_for(starting, 30)
        assert agent.registered_seq == 1

        await server.astop(remove_data=False)
        job = task("job-r", [PY, "-c", "raise SystemExit(2)"], ranks=1)
        job = msgspec.structs.replace(job, node_id="node-7")
        await asyncio.to_thread(launcher.launch, job)
        await asyncio.sleep(1.5)  # the rank has exited; its RankExited waits for the log
        await server.astart()
        await wait_until(lambda: _has(rank_exits(log, "job-r", "node-7"), 1), "RankExited after the outage")
        assert await rank_exits(log, "job-r", "node-7") == {0: 2}
        assert len(await events_on(log, subjects.agent_job("node-7", "job-r"))) == 1
        assert launcher.unreported() == []
    finally:
        await agent.close()
        await log.close()
        await server.astop()


# -- checkpoint and progress reports (RALLY_REPORT_FILE) ----------------------------------------------

# Rank r reports steps 1-3, commits step 100(r+1)+10, writes half of the commit of +20 and waits for
# "go"; then completes it, reports step 4 and commits +30. On SIGTERM (preemption) it commits +99 and
# exits 0. Steps differ per rank so every rank's commits can be ordered against its own exit.
REPORTING_RANK = r"""
import json, os, signal, sys, time
folder = sys.argv[1]
rank = int(os.environ["RANK"])
ident = {"job_id": os.environ["RALLY_JOB_ID"], "attempt": int(os.environ["RALLY_ATTEMPT"]), "rank": rank}

def write(data):
    with open(os.environ["RALLY_REPORT_FILE"], "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

def line(kind, **fields):
    return (json.dumps({"kind": kind, **ident, **fields, "at": time.time()}) + "\n").encode()

def commit(step):
    return line("checkpoint", step=step, path=f"/ckpt/{ident['job_id']}/step-{step}",
                manifest_sha256="ab" * 32, bytes=1000 + step, shards=2, save_s=0.01)

def mark(name):
    open(os.path.join(folder, f"{name}-{rank}"), "w").close()

def preempted(signum, frame):
    write(commit(100 * (rank + 1) + 99))
    sys.exit(0)

signal.signal(signal.SIGTERM, preempted)
for step in (1, 2, 3):
    write(line("step", step=step, step_time_s=0.5 + rank))
write(commit(100 * (rank + 1) + 10))
half = commit(100 * (rank + 1) + 20)
write(half[:40])
mark("partial")
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.02)
write(half[40:])
write(line("step", step=4, step_time_s=0.25))
write(commit(100 * (rank + 1) + 30))
mark("written")
while True:
    time.sleep(0.05)
"""


async def stored(log: EventLog) -> list[Recorded]:
    return [rec async for rec in log.replay() if isinstance(rec, Recorded)]


async def commits(log: EventLog, job_id: str) -> list[int]:
    """Steps of the job's CheckpointCommitted events, in log order (duplicates included)."""
    return [
        r.event.step
        for r in await stored(log)
        if isinstance(r.event, CheckpointCommitted) and r.event.job_id == job_id
    ]


async def has_commits(log: EventLog, job_id: str, steps: set[int]) -> bool:
    return set(await commits(log, job_id)) >= steps


async def files_exist(*paths: Path) -> bool:
    return all(p.exists() for p in paths)


async def progress_of(log: EventLog, job_id: str) -> dict[int, tuple[int | None, float | None]]:
    beat = await first_heartbeat(log)
    return {r.rank: (r.step, r.step_time_s) for r in beat.ranks if r.job_id == job_id and r.progress_at}


async def test_checkpoint_reports_are_appended_once_each_and_before_the_rank_exit(
    event_log: EventLog, agent_env: Callable[..., Agent], tmp_path: Path
) -> None:
    # A short duplicate window, so an append repeated after an agent restart would show as a second
    # message: only the saved read offsets can keep each commit single.
    config = (await event_log.js.stream_info(event_log.stream)).config
    config.duplicate_window = 0.5
    await event_log.js.update_stream(config)
    first = agent_env()
    await first_heartbeat(event_log)
    shared = tmp_path / "shared"
    assert (await launch(event_log, task("job-c", [PY, "-c", REPORTING_RANK, str(shared)]))).ok

    await wait_until(lambda: has_commits(event_log, "job-c", {110, 210}), "the first commits")
    await wait_until(lambda: files_exist(shared / "partial-0", shared / "partial-1"), "half lines")

    async def progress_shown() -> bool:
        return await progress_of(event_log, "job-c") == {0: (3, 0.5), 1: (3, 1.5)}

    await wait_until(progress_shown, "step progress in a heartbeat")
    await asyncio.sleep(0.6)  # a few polls: a half-written line is not consumed, nor skipped
    assert sorted(await commits(event_log, "job-c")) == [110, 210]

    await first.crash()
    (shared / "go").write_text("")  # the ranks finish the half line and commit again, unwatched
    await wait_until(lambda: files_exist(shared / "written-0", shared / "written-1"), "commits")
    agent_env()
    await wait_until(lambda: has_commits(event_log, "job-c", {120, 130, 220, 230}), "commits after restart")

    async def progress_after_restart() -> bool:
        return await progress_of(event_log, "job-c") == {0: (4, 0.25), 1: (4, 0.25)}

    await wait_until(progress_after_restart, "the restarted agent's heartbeat with step 4")

    # Preemption: SIGTERM -> each rank commits, then exits 0; its commit must precede its exit.
    kill = KillTask(job_id="job-c", attempt=0, grace_s=10)
    assert msgspec.json.decode(await request(event_log, "kill", kill), type=KillReply).signalled == 2
    await wait_until(lambda: _has(rank_exits(event_log, "job-c"), 2), "both RankExited")
    assert await rank_exits(event_log, "job-c") == {0: 0, 1: 0}
    records = await stored(event_log)
    seq_of_commit = {r.event.step: r.seq for r in records if isinstance(r.event, CheckpointCommitted)}
    seq_of_exit = {r.event.rank: r.seq for r in records if isinstance(r.event, RankExited)}
    assert seq_of_commit[199] < seq_of_exit[0] and seq_of_commit[299] < seq_of_exit[1]
    steps = await commits(event_log, "job-c")
    assert sorted(steps) == [110, 120, 130, 199, 210, 220, 230, 299]  # each exactly once
    committed = next(r for r in records if isinstance(r.event, CheckpointCommitted) and r.event.step == 120)
    assert committed.subject == subjects.agent_checkpoint(NODE, "job-c")
    assert isinstance(committed.event, CheckpointCommitted)
    assert (committed.event.path, committed.event.bytes, committed.event.node_id) == (
        "/ckpt/job-c/step-120",
        1120,
        NODE,
    )


async def test_the_agent_leaves_no_zombie(
    event_log: EventLog, agent_env: Callable[..., Agent], tmp_path: Path
) -> None:
    """Short ranks, and a rank whose wrapper is SIGKILLed under an agent that adopts orphans (as PID 1
    of its container does): every child of the agent is reaped."""
    agent = agent_env(subreaper=True)
    await first_heartbeat(event_log)
    # ranks without GPUs: tasks this close together on the same GPUs would stop each other (a rank of
    # another attempt on a GPU a launch gets is stale)
    for j in range(10):
        assert (await launch(event_log, task(f"short-{j}", ["true"], ranks=4, gpus_per_rank=0))).ok
    sleeper = task("job-lost", [PY, "-c", "import time; time.sleep(60)"], ranks=1, gpus_per_rank=0)
    assert (await launch(event_log, sleeper)).ok
    pid_file = tmp_path / "work" / "job-lost" / "0" / "rank-0.pid"
    await wait_until(lambda: files_exist(pid_file), "the sleeper's wrapper")
    record = read_record(pid_file)
    assert record is not None
    os.kill(record["wrapper_pid"], signal.SIGKILL)  # its rank dies (parent-death signal), orphaned

    async def all_short_exits() -> bool:
        exited = [r.event for r in await stored(event_log) if isinstance(r.event, RankExited)]
        return sum(e.job_id.startswith("short-") and e.exit_code == 0 for e in exited) == 40

    await wait_until(all_short_exits, "40 short ranks reported", 30.0)
    await wait_until(lambda: _has(rank_exits(event_log, "job-lost"), 1), "the lost rank")
    assert await rank_exits(event_log, "job-lost") == {0: EXIT_LOST}

    async def no_zombie() -> bool:
        return not zombie_children(agent.proc.pid)

    await wait_until(no_zombie, "every child of the agent reaped", 15.0)
