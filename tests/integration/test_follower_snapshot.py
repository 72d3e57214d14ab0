"""A service started from the shared snapshot plus the log's tail ends in the state a full replay gives."""

from __future__ import annotations

from rallypoint.eventlog import EventLog, SnapshotStore
from rallypoint.events import GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import SNAPSHOT_NAME


async def _events(log: EventLog, first: int, count: int) -> None:
    for i in range(first, first + count):
        spec = JobSpec(name=f"j{i}", team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
        await log.append(
            subjects.job(f"j{i}"),
            JobSubmitted(job_id=f"j{i}", spec=spec, submitted_at=float(i)),
            msg_id=f"j{i}:0:JobSubmitted",
            source="test",
        )


async def test_snapshot_plus_tail_equals_a_full_replay(event_log: EventLog) -> None:
    gpus = tuple(GpuInfo(index=i, uuid=f"u{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    await event_log.append(
        subjects.node_registration("n1"),
        NodeRegistered(
            node_id="n1",
            address="a",
            rack="r",
            gpu_type="g",
            gpus=gpus,
            cpu_milli=1,
            memory_mib=1,
            agent_instance="i",
            at=0.0,
        ),
        msg_id="n1:reg",
        source="test",
    )
    await _events(event_log, 0, 20)
    store = await SnapshotStore.open(event_log.js)
    first = Follower(event_log)
    await first.catch_up()
    assert await first.save(store, SNAPSHOT_NAME) == 21

    await _events(event_log, 20, 15)
    restarted = Follower(event_log)
    assert await restarted.restore(store, SNAPSHOT_NAME)
    assert restarted.state.last_seq == 21  # started from the snapshot, not from zero
    await restarted.catch_up()

    full = Follower(event_log)
    await full.catch_up()
    assert restarted.state.last_seq == full.state.last_seq == 36
    assert restarted.state.hash() == full.state.hash()


async def test_an_unreadable_snapshot_falls_back_to_a_full_replay(event_log: EventLog) -> None:
    await _events(event_log, 0, 3)
    store = await SnapshotStore.open(event_log.js)
    await store.save(SNAPSHOT_NAME, 3, b"not a cluster state")
    follower = Follower(event_log)
    assert not await follower.restore(store, SNAPSHOT_NAME)
    await follower.catch_up()
    assert follower.state.last_seq == 3 and len(follower.state.jobs) == 3
