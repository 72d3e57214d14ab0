"""The event log against a real nats-server: appends, guards, replay, follow, snapshots."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import nats
import nats.js.errors
import pytest

from rallypoint.eventlog import (
    AppendConflict,
    EventLog,
    LogGap,
    LogUnavailable,
    Recorded,
    SnapshotStore,
    StateSnapshot,
    UndecodableEvent,
)
from rallypoint.events import (
    GangBound,
    JobCancelRequested,
    JobQueued,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    TaskPlacement,
    subjects,
)
from rallypoint.infra import NatsServer, free_port

SPEC = JobSpec(
    name="train", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=8, command=("python", "t.py")
)


def submitted(job_id: str, at: float = 1_700_000_000.0) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=SPEC, submitted_at=at)


def bound(job_id: str, epoch: int) -> GangBound:
    return GangBound(
        job_id=job_id,
        attempt=0,
        epoch=epoch,
        placements=(TaskPlacement(task=0, node_id="n1", gpus=tuple(range(8))),),
        computed_at_seq=1,
        policy_version="test",
        now=1.0,
        at=2.0,
    )


async def test_append_and_replay_round_trip(event_log: EventLog) -> None:
    events = [submitted(f"j{i}") for i in range(5)]
    seqs = [
        await event_log.append(subjects.job(e.job_id), e, msg_id=f"{e.job_id}:0:JobSubmitted", source="test")
        for e in events
    ]
    assert seqs == [1, 2, 3, 4, 5]
    assert await event_log.last_seq() == 5
    assert await event_log.last_seq("rally.job.j3") == 4
    assert await event_log.last_seq("rally.node.>") == 0

    replayed = [rec async for rec in event_log.replay()]
    assert [r.seq for r in replayed] == seqs
    assert [r.event for r in replayed] == events
    first = replayed[0]
    assert first.subject == "rally.job.j0"
    assert first.envelope["id"] == "j0:0:JobSubmitted"
    assert first.envelope["type"] == "io.rallypoint.JobSubmitted.v1"
    assert first.envelope["source"] == "test"
    assert first.envelope["time"] == "2023-11-14T22:13:20Z"  # from submitted_at, not the clock
    assert (await event_log.get(3)).event == events[2]


async def test_same_msg_id_is_stored_once(event_log: EventLog) -> None:
    event = submitted("dup")
    one = await event_log.append_ack("rally.job.dup", event, msg_id="dup:0:JobSubmitted", source="t")
    two = await event_log.append_ack("rally.job.dup", event, msg_id="dup:0:JobSubmitted", source="t")
    assert one.seq == two.seq == 1
    assert (one.duplicate, two.duplicate) == (False, True)
    assert await event_log.last_seq() == 1


async def test_wrong_expected_sequence_is_a_conflict(event_log: EventLog) -> None:
    await event_log.append(
        "rally.job.a", submitted("a"), msg_id="a:0:JobSubmitted", source="t", expected_last_subject_seq=0
    )
    with pytest.raises(AppendConflict) as err:
        # Another submission of the same job id: the subject is no longer empty.
        await event_log.append(
            "rally.job.a", submitted("a"), msg_id="a:1:JobSubmitted", source="t", expected_last_subject_seq=0
        )
    assert err.value.code == 10071
    assert await event_log.last_seq() == 1


async def test_retried_conditional_append_is_a_duplicate_not_a_conflict(event_log: EventLog) -> None:
    # The server checks the expected sequence before de-duplicating; append recognises its own retry.
    first = await event_log.append_ack(
        "rally.job.r", submitted("r"), msg_id="r:0:JobSubmitted", source="t", expected_last_subject_seq=0
    )
    retry = await event_log.append_ack(
        "rally.job.r", submitted("r"), msg_id="r:0:JobSubmitted", source="t", expected_last_subject_seq=0
    )
    assert retry == (first.seq, True)


async def test_concurrent_writers_expecting_the_same_seq_exactly_one_wins(event_log: EventLog) -> None:
    base = await event_log.append("rally.job.c", submitted("c"), msg_id="c:0:JobSubmitted", source="t")
    writers = 16

    async def write(i: int) -> int | AppendConflict:
        try:
            return await event_log.append(
                "rally.job.c",
                JobCancelRequested(job_id="c", at=1.0, requested_by=f"w{i}"),
                msg_id=f"c:0:JobCancelRequested:{i}",
                source=f"w{i}",
                expected_last_subject_seq=base,
            )
        except AppendConflict as exc:
            return exc

    results = await asyncio.gather(*(write(i) for i in range(writers)))
    wins = [r for r in results if isinstance(r, int)]
    losses = [r for r in results if isinstance(r, AppendConflict)]
    stored = [(r.seq, r.envelope["id"]) async for r in event_log.replay()]
    assert len(wins) == 1 and len(losses) == writers - 1, (results, stored)
    assert {r.code for r in losses} <= {10071, 10164}
    assert len(stored) == 2 and stored[1][0] == wins[0], (results, stored)


async def test_the_stream_refuses_delete_and_purge(event_log: EventLog) -> None:
    for i in range(3):
        await event_log.append(subjects.job(f"d{i}"), submitted(f"d{i}"), msg_id=f"d{i}", source="t")
    nc = event_log.nc
    stream = event_log.stream
    attempts = [
        (f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": 2}),
        (f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": 2, "no_erase": True}),
        (f"$JS.API.STREAM.PURGE.{stream}", {}),
        (f"$JS.API.STREAM.PURGE.{stream}", {"filter": "rally.job.d1"}),
        (f"$JS.API.STREAM.PURGE.{stream}", {"keep": 1}),
    ]
    for api_subject, body in attempts:
        reply = json.loads((await nc.request(api_subject, json.dumps(body).encode(), timeout=2)).data)
        assert "error" in reply, (api_subject, body, reply)
        assert reply["error"]["err_code"] in {10057, 10110}, reply
    # Nor can the guard itself be switched off afterwards.
    loosened = event_log.stream_config()
    loosened.deny_delete = loosened.deny_purge = False
    with pytest.raises(nats.js.errors.APIError) as err:
        await event_log.js.update_stream(loosened)
    assert err.value.err_code == 10052
    assert [r.seq for r in [rec async for rec in event_log.replay()]] == [1, 2, 3]


async def test_replay_to_seq_and_with_a_subject_filter(event_log: EventLog) -> None:
    for i in range(6):
        subject = subjects.admission("x") if i % 2 == 0 else subjects.admission("y")
        await event_log.append(
            subject,
            JobQueued(job_id="x" if i % 2 == 0 else "y", queue="q", at=float(i)),
            msg_id=f"q{i}",
            source="t",
        )
    assert await seqs(event_log.replay(to_seq=4)) == [1, 2, 3, 4]
    assert await seqs(event_log.replay(from_seq=3, to_seq=5)) == [3, 4, 5]
    assert await seqs(event_log.replay(subjects="rally.queue.y")) == [2, 4, 6]
    assert await seqs(event_log.replay(subjects="rally.queue.x", to_seq=4)) == [1, 3]
    assert await seqs(event_log.replay(subjects="rally.node.>")) == []
    assert await seqs(event_log.replay(from_seq=7)) == []
    with pytest.raises(LogGap):
        _ = [r async for r in event_log.replay(to_seq=99)]


async def seqs(records: AsyncIterator[Recorded]) -> list[int]:
    return [rec.seq async for rec in records]


async def test_follow_sees_new_events(event_log: EventLog) -> None:
    await event_log.append("rally.job.f0", submitted("f0"), msg_id="f0", source="t")
    seen: list[int] = []

    async def consume() -> None:
        async for rec in event_log.follow(from_seq=1):
            seen.append(rec.seq)
            if len(seen) == 4:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    for i in range(1, 4):
        await event_log.append(f"rally.job.f{i}", submitted(f"f{i}"), msg_id=f"f{i}", source="t")
    await asyncio.wait_for(task, 5)
    assert seen == [1, 2, 3, 4]


async def test_undecodable_event_names_its_seq(event_log: EventLog) -> None:
    await event_log.append("rally.job.u", submitted("u"), msg_id="u", source="t")
    await event_log.js.publish("rally.job.u", b'{"type": "Nope.v9"}')
    with pytest.raises(UndecodableEvent, match="seq 2"):
        _ = [r async for r in event_log.replay()]


async def test_stale_scheduler_is_fenced_by_a_new_epoch(event_log: EventLog) -> None:
    tree = subjects.SCHEDULER_TREE
    # Leader A starts epoch 1 on an empty tree, then binds a job.
    a_pos = await event_log.last_seq(tree)
    a_pos = await event_log.append(
        subjects.EPOCH,
        LeaderEpochStarted(epoch=1, leader_id="A", at=1.0),
        msg_id="epoch:1",
        source="sched-A",
        expected_last_subject_seq=a_pos,
        expected_subject_filter=tree,
    )
    a_pos = await event_log.append(
        subjects.bind("j1"),
        bound("j1", 1),
        msg_id="j1:0:GangBound",
        source="sched-A",
        expected_last_subject_seq=a_pos,
        expected_subject_filter=tree,
    )
    # Unrelated writers do not disturb the scheduler's guard.
    await event_log.append("rally.job.j2", submitted("j2"), msg_id="j2:0:JobSubmitted", source="api")

    # B wins the lease, reads the tree position and fences A with epoch 2.
    b_pos = await event_log.last_seq(tree)
    assert b_pos == a_pos
    await event_log.append(
        subjects.EPOCH,
        LeaderEpochStarted(epoch=2, leader_id="B", at=3.0),
        msg_id="epoch:2",
        source="sched-B",
        expected_last_subject_seq=b_pos,
        expected_subject_filter=tree,
    )

    # A, unaware, writes its next decision on a different subject of the tree: rejected.
    with pytest.raises(AppendConflict) as err:
        await event_log.append(
            subjects.bind("j2"),
            bound("j2", 1),
            msg_id="j2:0:GangBound",
            source="sched-A",
            expected_last_subject_seq=a_pos,
            expected_subject_filter=tree,
        )
    assert err.value.code == 10071
    binds = [r.subject async for r in event_log.replay(subjects="rally.sched.bind.>")]
    assert binds == ["rally.sched.bind.j1"]


async def test_snapshot_store_round_trip(event_log: EventLog) -> None:
    role = f"snap-{time.monotonic_ns()}"
    store = await SnapshotStore.open(event_log.js, role)
    try:
        assert await store.load() is None
        payload = bytes(range(256)) * 4096  # 1 MiB: bigger than one NATS message
        await store.save(event_log, StateSnapshot(41, "a" * 64, payload), 1)
        await store.save(event_log, StateSnapshot(42, "b" * 64, payload + b"!"), 1)
        assert await store.load() == StateSnapshot(42, "b" * 64, payload + b"!")
        assert await event_log.last_seq(subjects.snapshot_taken(role)) == 2  # each save recorded
    finally:
        await event_log.js.delete_object_store(f"rally-snapshots-{role}")


async def test_unreachable_log_is_unavailable() -> None:
    with pytest.raises(LogUnavailable):
        await EventLog.connect(f"nats://127.0.0.1:{free_port()}", name="t", initial_timeout=0.5)
    async with NatsServer() as server:
        log = await EventLog.connect(server.url, name="t")
        log.js._timeout = 0.5  # keep the test short; production default is 5 s
        try:
            await server.astop(remove_data=False)
            with pytest.raises(LogUnavailable):
                await log.append("rally.job.z", submitted("z"), msg_id="z", source="t")
        finally:
            await log.close()


async def test_follow_survives_a_server_restart() -> None:
    async with NatsServer() as server:
        log = await EventLog.connect(server.url, name="t")
        try:
            await log.append("rally.job.s0", submitted("s0"), msg_id="s0", source="t")
            seen: list[int] = []

            async def consume() -> None:
                async for rec in log.follow(from_seq=1, probe_interval=0.5):
                    seen.append(rec.seq)
                    if len(seen) == 3:
                        return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.3)
            await server.astop(remove_data=False)
            await server.astart()  # same port and store: the stream survives, the consumer does not
            for i in (1, 2):
                for _ in range(50):
                    try:
                        await log.append(f"rally.job.s{i}", submitted(f"s{i}"), msg_id=f"s{i}", source="t")
                        break
                    except LogUnavailable:
                        await asyncio.sleep(0.1)
            await asyncio.wait_for(task, 15)
            assert seen == [1, 2, 3]
        finally:
            await log.close()


async def test_raw_nats_client_sees_the_ce_headers(event_log: EventLog, nats_server: NatsServer) -> None:
    await event_log.append("rally.job.h", submitted("h"), msg_id="h:0:JobSubmitted", source="api")
    nc = await nats.connect(nats_server.url)
    try:
        raw = await nc.jetstream().get_msg(event_log.stream, seq=1)
        assert raw.headers is not None
        assert raw.headers["Nats-Msg-Id"] == "h:0:JobSubmitted"
        assert raw.headers["ce-specversion"] == "1.0"
    finally:
        await nc.close()
