"""The checkpoint service's shell on a real NATS log over real checkpoint folders.

The test appends what a node agent would (``CheckpointCommitted`` for step folders written with the
training client's layout) and runs the service's keeper in-process: valid steps become verified, a step
with a flipped byte becomes corrupt, retention removes older folders and records ``CheckpointDeleted``,
never the newest complete step, and a restarted service appends nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from rallypoint_services.checkpoint.actions import CheckpointActions
from rallypoint_services.checkpoint.keeper import CheckpointKeeper

from rallypoint.agent.node import CHECKPOINT_FIELDS
from rallypoint.checkpoints import RetentionPolicy
from rallypoint.ckpt import Checkpointer, step_dir, verify_checkpoint
from rallypoint.eventlog import EventLog
from rallypoint.events import (
    CheckpointCommitted,
    CheckpointDeleted,
    CheckpointVerified,
    JobSpec,
    JobSubmitted,
    subjects,
)
from rallypoint.runtime.follower import Follower
from rallypoint.state import JobView

WORLD = 2


@dataclass
class Service:
    """One running instance: its own follower, keeper and stop switch."""

    follower: Follower
    keeper: CheckpointKeeper
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]

    def job(self, job_id: str) -> JobView:
        return self.follower.state.jobs[job_id]

    async def until(self, what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not (check() and self.keeper.idle):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await self.follower.next_change(0.05)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.tasks[1], 10.0)
        self.tasks[0].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.tasks[0]


async def start_service(log: EventLog, keep: int, *, sweep_s: float = 60.0) -> Service:
    follower = Follower(log)
    await follower.catch_up()
    following = asyncio.create_task(follower.run())
    actions = CheckpointActions(log, follower, verify_checkpoint)
    keeper = CheckpointKeeper(
        log, follower, actions, policy=RetentionPolicy(keep=keep), tick_s=0.2, sweep_s=sweep_s
    )
    stop = asyncio.Event()
    running = asyncio.create_task(keeper.run(stop))
    return Service(follower, keeper, stop, [following, running])


@pytest.fixture
async def services(event_log: EventLog) -> AsyncIterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        await service.close()


async def submit(log: EventLog, job_id: str, checkpoint_dir: Path) -> None:
    spec = JobSpec(
        name="train",
        team="nlp",
        gpus=WORLD,
        gpus_per_task=WORLD,
        ranks_per_task=WORLD,
        command=("true",),
        checkpoint_dir=str(checkpoint_dir),
    )
    event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0)
    await log.append(subjects.job(job_id), event, msg_id=f"{job_id}:0:JobSubmitted", source="test")


def save_step(root: Path, job_id: str, step: int) -> dict[str, Any]:
    """Every rank saves ``step`` with the training client; returns rank 0's commit report line."""
    report = root.parent / f"{job_id}.report.jsonl"
    ranks = [
        Checkpointer(root, rank=r, world_size=WORLD, job_id=job_id, attempt=1, report_file=report)
        for r in range(WORLD)
    ]
    for checkpointer in ranks:
        checkpointer.save(step, {"weights": np.full(1024, step, dtype=np.float32), "step": step})
    for checkpointer in ranks:
        checkpointer.close()
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    line: dict[str, Any] = [x for x in lines if x["kind"] == "checkpoint" and x["step"] == step][-1]
    return line


async def commit(log: EventLog, line: dict[str, Any], **override: Any) -> None:
    """What the node agent appends for a commit report line (the same fields and message id)."""
    fields = {k: line[k] for k in CHECKPOINT_FIELDS} | {"node_id": "n0"} | override
    event = msgspec.convert(fields, CheckpointCommitted)
    msg_id = f"{event.job_id}:ckpt:{event.step}"
    await log.append(subjects.for_event(event), event, msg_id=msg_id, source="test")


def flip_a_byte(root: Path, step: int) -> None:
    shard = step_dir(root, step) / "rank-00001.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def statuses(job: JobView) -> dict[int, str]:
    return {c.step: c.status for c in job.checkpoints}


async def checkpoint_events(log: EventLog) -> list[CheckpointVerified | CheckpointDeleted]:
    return [
        rec.event
        async for rec in log.replay()
        if isinstance(rec.event, CheckpointVerified | CheckpointDeleted)
    ]


def on_disk(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*"))


# --- tests ------------------------------------------------------------------------------------------


async def test_verify_corrupt_retention_and_restart(
    event_log: EventLog, services: list[Service], tmp_path: Path
) -> None:
    root = tmp_path / "j-a"
    await submit(event_log, "j-a", root)
    lines = [save_step(root, "j-a", step) for step in (10, 20, 30, 40)]
    flip_a_byte(root, 40)  # the newest step is corrupt: the newest complete one is 30
    for line in lines:
        await commit(event_log, line)

    service = await start_service(event_log, keep=2)
    services.append(service)
    await service.until(
        "verification and retention", lambda: statuses(service.job("j-a")).get(10) == "deleted"
    )

    job = service.job("j-a")
    assert statuses(job) == {10: "deleted", 20: "verified", 30: "verified", 40: "deleted"}
    latest = job.latest_checkpoint()
    assert latest is not None and latest.step == 30
    assert on_disk(root) == [20, 30]
    events = await checkpoint_events(event_log)
    corrupt = [e for e in events if isinstance(e, CheckpointVerified) and not e.ok]
    assert [(e.step, e.error) for e in corrupt] == [(40, "shard rank-00001.npz does not match its sha256")]
    deleted = {e.step: e.reason for e in events if isinstance(e, CheckpointDeleted)}
    assert deleted[10] == "retention: older than the newest 2 complete checkpoints"
    assert deleted[40] == "corrupt: shard rank-00001.npz does not match its sha256"
    assert len(events) == 6  # four verifications, two deletions

    # A restarted service finds nothing to do: the fold already says what was done.
    await service.close()
    services.remove(service)
    last = await event_log.last_seq()
    restarted = await start_service(event_log, keep=2)
    services.append(restarted)
    await restarted.until("the first pass", lambda: restarted.keeper.passes >= 1)
    await asyncio.sleep(0.5)
    assert await event_log.last_seq() == last

    # A new step: verified, and step 20 falls out of the newest two.
    await commit(event_log, save_step(root, "j-a", 50))
    await restarted.until("step 20 deleted", lambda: statuses(restarted.job("j-a")).get(20) == "deleted")
    assert statuses(restarted.job("j-a"))[50] == "verified"
    assert on_disk(root) == [30, 50]


async def test_the_newest_complete_step_survives_newer_corrupt_ones(
    event_log: EventLog, services: list[Service], tmp_path: Path
) -> None:
    root = tmp_path / "j-b"
    await submit(event_log, "j-b", root)
    lines = [save_step(root, "j-b", step) for step in (1, 2, 3)]
    flip_a_byte(root, 2)
    flip_a_byte(root, 3)
    service = await start_service(event_log, keep=1)
    services.append(service)
    for line in lines:
        await commit(event_log, line)

    expected = {1: "verified", 2: "deleted", 3: "deleted"}
    await service.until("corrupt steps deleted", lambda: statuses(service.job("j-b")) == expected)
    assert on_disk(root) == [1]


@pytest.mark.parametrize(
    ("override", "verify_error", "left_because"),
    [
        # The folder holds another save of step 7 than the committed one: not this checkpoint's files.
        ("manifest_sha256", "differs from the committed", "its manifest was rewritten after the commit"),
        # The event names the job's whole checkpoint folder: no manifest there, and never rmtree'd.
        ("path", "no manifest", "is not the folder of step 7"),
    ],
)
async def test_a_bad_commit_is_corrupt_and_its_files_are_left_alone(
    event_log: EventLog,
    services: list[Service],
    tmp_path: Path,
    override: str,
    verify_error: str,
    left_because: str,
) -> None:
    root = tmp_path / "j-c"
    await submit(event_log, "j-c", root)
    line = save_step(root, "j-c", 7)
    service = await start_service(event_log, keep=3)
    services.append(service)
    wrong = {"manifest_sha256": "0" * 64, "path": str(root.resolve())}[override]
    await commit(event_log, line, **{override: wrong})

    await service.until("step 7 deleted", lambda: statuses(service.job("j-c")).get(7) == "deleted")
    verdict = [e for e in await checkpoint_events(event_log) if isinstance(e, CheckpointVerified)]
    assert not verdict[0].ok and verify_error in verdict[0].error
    assert left_because in service.job("j-c").checkpoints[0].error
    assert on_disk(root) == [7]


async def test_only_jobs_whose_checkpoints_changed_are_planned(
    event_log: EventLog, services: list[Service], tmp_path: Path
) -> None:
    for i in range(300):
        await submit(event_log, f"j-{i:03d}", tmp_path / f"j-{i:03d}")
    service = await start_service(event_log, keep=3)
    services.append(service)
    await service.until("the first pass", lambda: service.keeper.passes >= 300)
    first = service.keeper.passes

    await commit(event_log, save_step(tmp_path / "j-007", "j-007", 1))
    await service.until("step 1 verified", lambda: statuses(service.job("j-007")).get(1) == "verified")

    # The commit, the verification and the follow-up plan: a handful of passes, not 300 per event.
    assert service.keeper.passes - first <= 4
