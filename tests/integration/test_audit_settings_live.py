"""The audit reads the scheduler's own settings from the log (issue 31, Build item 3).

A real scheduler leader on a real NATS log runs with a queue file and a repair wait that are not the
defaults (as `rally up`'s does: its own queues.yaml, --repair-wait 30): it binds two jobs, requeues one
gang 31 s after a node is lost and explains why it waits.
`rally replay --verify-decisions` with no flags then replays every one of them under the settings the
leader recorded, and exits 0; before, it replayed them under the defaults and exited 1 ("made under
another policy"). A flag given explicitly still replaces the recorded value, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rallypoint_services.scheduler.leader import SchedulerLoop
from test_trace_chain import following  # this folder is on sys.path (rootdir-relative imports)

from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog, Recorded
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobInterrupted,
    JobPending,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeHeartbeatLost,
    NodeLost,
    NodeRegistered,
    SchedulerSettings,
    subjects,
)
from rallypoint.infra import NatsServer
from rallypoint.scheduling import SchedulingPolicy, load_queue_config

QUEUES = {
    "cohorts": [{"name": "all"}],
    "teams": [{"name": "lang", "cohort": "all", "nominal": 16, "borrowing_limit": 0}],
}
REPAIR_WAIT_S = 30.0  # rally up's; the scheduler's default is 60


class Clock:
    """The leader's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _append(log: EventLog, subject: str, event: Event) -> None:
    await log.append(subject, event, msg_id=f"{subject}:{type(event).__name__}", source="test")


async def _register(log: EventLog, node_id: str, gpu_type: str = "sim") -> None:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    event = NodeRegistered(
        node_id=node_id, address="h", rack="r0", gpu_type=gpu_type, gpus=gpus, cpu_milli=1000,
        memory_mib=1000, agent_instance="a", at=1.0,
    )  # fmt: skip
    await _append(log, subjects.node_registration(node_id), event)


async def _submit(log: EventLog, job_id: str, gpus: int) -> None:
    spec = JobSpec(name=job_id, team="lang", gpus=gpus, gpus_per_task=8, ranks_per_task=1, command=("true",))
    await _append(log, subjects.job(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0))


@contextlib.asynccontextmanager
async def _leading(log: EventLog, queue_file: Path, clock: Clock) -> AsyncIterator[SchedulerLoop]:
    """A scheduler leader as `rally serve scheduler --queues FILE --repair-wait 30` runs it."""
    queues, classes = load_queue_config(queue_file)
    policy = SchedulingPolicy("rallypoint", queues=queues, priority_classes=classes)
    async with following(log) as follower:
        loop = SchedulerLoop(
            log,
            follower,
            instance="s1",
            policy=policy,
            clock=clock,
            repair_wait_s=REPAIR_WAIT_S,
            queue_file=str(queue_file),
        )
        await loop.start_epoch()
        yield loop


async def _cycle(log: EventLog, loop: SchedulerLoop) -> None:
    await loop.follower.wait_for(await log.last_seq())
    await loop.cycle()
    await loop.follower.wait_for(await log.last_seq())


async def _lose_node_of(log: EventLog, job_id: str, node_id: str, at: float) -> None:
    """The node's loss as the health monitor writes it, and the gang's interruption as the job
    controller writes it."""
    health = subjects.node_health(node_id)
    await _append(log, health, NodeHeartbeatLost(node_id=node_id, last_seen=at - 1.0, at=at))
    await _append(log, health, NodeLost(node_id=node_id, reason="gone", at=at))
    interrupted = JobInterrupted(job_id=job_id, attempt=1, failed_nodes=(node_id,), reason="gone", at=at)
    await _append(log, subjects.job_control(job_id), interrupted)


async def _events(log: EventLog) -> list[Event]:
    """The log's events, a ``GangsBound``'s binds each in its place."""
    return [
        event
        async for rec in log.replay()
        if isinstance(rec, Recorded)
        for event in subjects.members(rec.event)
    ]


async def _audit(capsys: pytest.CaptureFixture[str], url: str, *flags: str) -> tuple[int, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(rally, ["replay", "--nats-url", url, "--verify-decisions", *flags])
    return code, capsys.readouterr().out


async def _audit_json(capsys: pytest.CaptureFixture[str], url: str) -> dict[str, object]:
    code, out = await _audit(capsys, url, "-o", "json")
    report: dict[str, object] = json.loads(out)
    assert code == 0, out
    return report


async def test_the_audit_replays_decisions_under_the_settings_the_leader_recorded(
    event_log: EventLog, nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue_file = tmp_path / "queues.json"
    queue_file.write_text(json.dumps(QUEUES))
    clock = Clock()
    for node_id in ("n1", "n2"):
        await _register(event_log, node_id)
    await _register(event_log, "n3", gpu_type="other")  # no replacement for the gang's type
    await _submit(event_log, "gang", 16)
    await _submit(event_log, "small", 8)
    async with _leading(event_log, queue_file, clock) as loop:
        await _cycle(event_log, loop)  # binds the gang on n1 and n2, and small on n3
        await _append(
            event_log, subjects.job_control("gang"), JobStarted(job_id="gang", attempt=1, at=1001.0)
        )
        await _lose_node_of(event_log, "gang", "n2", at=1002.0)
        clock.now = 1002.0 + REPAIR_WAIT_S + 1.0  # past rally up's wait, not the default's
        await _cycle(event_log, loop)  # no replacement node: the gang is requeued
    events = await _events(event_log)
    (settings,) = [e for e in events if isinstance(e, SchedulerSettings)]
    assert (settings.queue_file, settings.repair_wait_s) == (str(queue_file), REPAIR_WAIT_S)
    assert settings.policy_version == loop.policy.version != SchedulingPolicy("rallypoint").version
    assert [e.job_id for e in events if isinstance(e, GangBound)] == ["gang", "small"]
    assert [e.code for e in events if isinstance(e, JobPending)] == ["NodeUnhealthy"]
    (requeue,) = [e for e in events if isinstance(e, JobRequeued)]
    assert "within 30 s" in requeue.reason

    code, out = await _audit(capsys, nats_server.url)
    assert code == 0, out
    assert "settings recorded by the scheduler at seq " in out and f"queues {queue_file}" in out, out
    report = await _audit_json(capsys, nats_server.url)
    tallies = report["tallies"]
    assert isinstance(tallies, dict)
    for kind, tally in tallies.items():
        assert tally["total"] == tally["verified"], (kind, tally)
    assert tallies["decisions"]["total"] >= 1 and tallies["repairs"]["total"] == 1
    assert tallies["reasons"]["total"] >= 1

    # an explicit flag still wins: the default repair wait would not have requeued the gang yet
    code, out = await _audit(capsys, nats_server.url, "--repair-wait", "60")
    assert code == 1, out
    assert "--repair-wait given: replaces what the scheduler recorded" in out
    assert "repairs and requeues: 1, each counted once: 0 recomputed identically, 1 differ" in out
