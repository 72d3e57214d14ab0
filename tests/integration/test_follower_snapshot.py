"""A service started from its own snapshot plus the log's tail ends in the state a full replay gives."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from nats.js.api import ObjectMeta

from rallypoint.eventlog import EventLog, SnapshotStore, StateSnapshot
from rallypoint.eventlog.snapshots import last_record
from rallypoint.events import GpuInfo, JobSpec, JobSubmitted, NodeRegistered, SnapshotTaken, subjects
from rallypoint.runtime.follower import Follower
from rallypoint.state import FOLD_VERSION


async def _events(log: EventLog, first: int, count: int) -> None:
    for i in range(first, first + count):
        spec = JobSpec(name=f"j{i}", team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
        await log.append(
            subjects.job(f"j{i}"),
            JobSubmitted(job_id=f"j{i}", spec=spec, submitted_at=float(i)),
            msg_id=f"j{i}:0:JobSubmitted",
            source="test",
        )


@pytest.fixture
async def store(event_log: EventLog) -> AsyncIterator[SnapshotStore]:
    """A role's snapshot store of its own on the session's server (a role name no other test uses)."""
    role = f"role-{uuid.uuid4().hex[:12]}"
    snapshots = await SnapshotStore.open(event_log.js, role)
    try:
        yield snapshots
    finally:
        await event_log.js.delete_object_store(f"rally-snapshots-{role}")


async def test_snapshot_plus_tail_equals_a_full_replay(event_log: EventLog, store: SnapshotStore) -> None:
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
    first = Follower(event_log)
    await first.catch_up()
    assert await first.save(store) == 21
    # The save is recorded in the log, after the state it describes, on the role's own subject.
    record = (await event_log.get(22)).event
    assert isinstance(record, SnapshotTaken)
    assert record == SnapshotTaken(
        role=store.role, seq=21, state_hash=first.state.hash(), fold_version=FOLD_VERSION, at=record.at
    )
    assert await event_log.last_seq(subjects.snapshot_taken(store.role)) == 22

    await _events(event_log, 20, 15)
    restarted = Follower(event_log)
    assert await restarted.restore(store)
    assert restarted.state.last_seq == 21  # started from the snapshot, not from zero
    await restarted.catch_up()

    full = Follower(event_log)
    await full.catch_up()
    assert restarted.state.last_seq == full.state.last_seq == 37
    assert restarted.state.hash() == full.state.hash()  # the fold skips SnapshotTaken, as a replay does


async def test_an_unreadable_snapshot_falls_back_to_a_full_replay(
    event_log: EventLog, store: SnapshotStore
) -> None:
    await _events(event_log, 0, 3)
    await store.save(event_log, StateSnapshot(3, "0" * 64, b"not a cluster state"), FOLD_VERSION)
    follower = Follower(event_log)
    assert not await follower.restore(store)
    await follower.catch_up()
    assert follower.state.last_seq == 4 and len(follower.state.jobs) == 3


async def test_a_save_killed_before_its_record_leaves_the_snapshot_before_it(
    event_log: EventLog, store: SnapshotStore
) -> None:
    """A service killed between writing a snapshot object and recording it (the kill -9 of a loaded
    cluster) restarts from the snapshot the log still vouches for, not from seq 1."""
    await _events(event_log, 0, 5)
    first = Follower(event_log)
    await first.catch_up()
    assert await first.save(store) == 5
    await _events(event_log, 5, 5)
    await first.catch_up()
    # The next save's first half: its object written, the kill before its SnapshotTaken was appended.
    half = StateSnapshot(first.state.last_seq, first.state.hash(), first.state.encode())
    slot = await store._free_slot(await last_record(event_log, store.role))
    await store._store.put(slot, half.payload, meta=ObjectMeta(name=slot, headers=_headers(half)))

    restarted = Follower(event_log)
    assert await restarted.restore(store)
    assert restarted.state.last_seq == 5  # the vouched snapshot, the unrecorded one passed over
    await restarted.catch_up()
    assert restarted.state.hash() == first.state.hash()


def _headers(snapshot: StateSnapshot) -> dict[str, str]:
    return {"Rally-Seq": str(snapshot.seq), "Rally-State-Hash": snapshot.state_hash}
