"""Atomic batch appends against a real nats-server: all or nothing, fenced on the first message, split
at the server's batch limit, a retried batch recognised, a deposed writer's whole batch refused; a
server whose limit is below ``MAX_BATCH`` refuses the larger batch whole and the writer splits at the
limit it names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from nats.js.api import StreamConfig

from rallypoint.eventlog import (
    MAX_BATCH,
    Append,
    AppendConflict,
    BatchTooLarge,
    EventLog,
    Recorded,
    subject_matches,
)
from rallypoint.eventlog.log import SERVER_DEFAULT_BATCH
from rallypoint.events import (
    GangBound,
    JobQueued,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    TaskPlacement,
    subjects,
)
from rallypoint.infra import NatsServer
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower

SPEC = JobSpec(name="t", team="nlp", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
TREE = subjects.SCHEDULER_TREE


def _bound(job_id: str) -> GangBound:
    return GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=(TaskPlacement(task=0, node_id="n1", gpus=(0,)),),
        computed_at_seq=1,
        policy_version="test",
        now=1.0,
        at=2.0,
    )


def _binds(prefix: str, n: int) -> list[Append]:
    return [
        Append(subjects.bind(f"{prefix}{i}"), _bound(f"{prefix}{i}"), f"{prefix}{i}:bind") for i in range(n)
    ]


def _queued(job_id: str) -> Append:
    return Append(
        subjects.admission(job_id), JobQueued(job_id=job_id, queue="nlp", at=1.0), f"{job_id}:queued"
    )


def _writer(log: EventLog, fence: int) -> FencedWriter:
    writer = FencedWriter(
        log,
        Follower(log),
        role="scheduler",
        tree=TREE,
        epoch_subject=subjects.EPOCH,
        instance="t",
        source="test",
    )
    writer.fence = fence
    return writer


async def _stored(log: EventLog) -> list[tuple[int, str, str]]:
    return [
        (r.seq, r.subject, r.envelope.get("id", "")) async for r in log.replay() if isinstance(r, Recorded)
    ]


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("rally.sched.>", "rally.sched.bind.j1", True),
        ("rally.sched.>", "rally.sched", False),
        ("rally.sched.>", "rally.queue.j1", False),
        ("rally.*.bind", "rally.sched.bind", True),
        ("rally.*.bind", "rally.sched.bind.j1", False),
        ("rally.sched.epoch", "rally.sched.epoch", True),
    ],
)
def test_subject_matches(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


async def test_a_batch_lands_in_order_on_contiguous_sequences(event_log: EventLog) -> None:
    await event_log.append(
        subjects.job("x"), JobSubmitted(job_id="x", spec=SPEC, submitted_at=1.0), msg_id="x", source="t"
    )
    batch = [_queued("a"), *_binds("b", 3)]
    result = await event_log.append_batch(
        batch, source="test", expected_last_subject_seq=0, expected_subject_filter=TREE
    )
    assert (result.first_seq, result.last_seq, result.duplicate) == (2, 5, False)
    stored = await _stored(event_log)
    assert [(s, subj) for s, subj, _ in stored[1:]] == [(2 + i, e.subject) for i, e in enumerate(batch)]
    # Each event keeps its own message id (deduplication) and CloudEvents envelope.
    assert [msg_id for _, _, msg_id in stored[1:]] == [e.msg_id for e in batch]


async def test_a_stale_fence_refuses_the_whole_batch(event_log: EventLog) -> None:
    await event_log.append_batch(
        _binds("a", 2), source="test", expected_last_subject_seq=0, expected_subject_filter=TREE
    )
    with pytest.raises(AppendConflict) as refused:
        # The fence rides on the first message only; the server checks it before storing any of the batch.
        await event_log.append_batch(
            [_queued("q"), *_binds("b", 2)],
            source="test",
            expected_last_subject_seq=0,
            expected_subject_filter=TREE,
        )
    assert refused.value.code == 10071
    assert await event_log.last_seq() == 2


async def test_a_retried_batch_that_landed_is_a_duplicate(event_log: EventLog) -> None:
    batch = _binds("a", 3)
    first = await event_log.append_batch(
        batch, source="test", expected_last_subject_seq=0, expected_subject_filter=TREE
    )
    # Same message ids, same (now stale) fence: the server refuses it (10201, a stored id), and the log
    # recognises its own earlier attempt.
    again = await event_log.append_batch(
        batch, source="test", expected_last_subject_seq=0, expected_subject_filter=TREE
    )
    assert again == (first.first_seq, first.last_seq, True)
    assert await event_log.last_seq() == 3


async def test_a_batch_holding_someone_elses_id_is_a_conflict(event_log: EventLog) -> None:
    await event_log.append_batch(_binds("a", 1), source="test")
    with pytest.raises(AppendConflict) as refused:
        await event_log.append_batch([*_binds("a", 1), *_binds("b", 1)], source="test")
    assert refused.value.code == 10201
    assert await event_log.last_seq() == 1


async def test_batch_size_is_checked_before_sending(event_log: EventLog) -> None:
    with pytest.raises(ValueError):
        await event_log.append_batch(_binds("a", MAX_BATCH + 1), source="test")
    with pytest.raises(ValueError):
        await event_log.append_batch([], source="test")


async def test_append_many_splits_at_the_limit_and_chains_the_fence(event_log: EventLog) -> None:
    writer = _writer(event_log, 0)
    writes = [*_binds("a", MAX_BATCH + 10), _queued("q")]
    last = await writer.append_many(writes)
    assert last == len(writes) == await event_log.last_seq()
    assert writer.fence == len(writes) - 1  # the last event on the tree, not the admission after it
    # A batch with nothing on the tree leaves the fence where it was, and is fenced all the same.
    assert await writer.append_many([_queued("r")]) == len(writes) + 1
    assert writer.fence == len(writes) - 1
    assert await writer.append_many([]) == 0


async def test_a_deposed_writer_loses_its_whole_batch(event_log: EventLog) -> None:
    old = _writer(event_log, 0)
    await old.append_many(_binds("a", 2))
    new = _writer(event_log, old.fence)
    await new.append(subjects.EPOCH, LeaderEpochStarted(epoch=2, leader_id="new", at=1.0), "epoch:2")
    before = await event_log.last_seq()
    with pytest.raises(AppendConflict):
        await old.append_many([_queued("q"), *_binds("b", 5)])
    assert await event_log.last_seq() == before


async def test_ensure_stream_turns_atomic_batches_on(event_log: EventLog) -> None:
    config = event_log.stream_config()
    config.allow_atomic = False
    await event_log.js.update_stream(StreamConfig.from_response(config.as_dict()))
    assert not (await event_log.js.stream_info(event_log.stream)).config.allow_atomic
    await event_log.ensure_stream()
    assert (await event_log.js.stream_info(event_log.stream)).config.allow_atomic
    await event_log.append_batch(_binds("a", 2), source="test")


async def test_a_reused_id_with_other_content_is_not_our_batch(event_log: EventLog) -> None:
    """Two leaders may give one decision the same id; the other leader's stored batch is not ours."""
    await event_log.append_batch(_binds("a", 2), source="test")
    theirs = [Append(w.subject, msgspec.structs.replace(w.event, epoch=2), w.msg_id) for w in _binds("a", 2)]
    with pytest.raises(AppendConflict):
        await event_log.append_batch(
            theirs, source="test", expected_last_subject_seq=0, expected_subject_filter=TREE
        )


@pytest.fixture
def default_limit_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server left at JetStream's own batch limit (1,000), below the ``MAX_BATCH`` we configure."""
    server = NatsServer(tmp_path / "nats", max_batch=None).start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_server_with_a_lower_batch_limit_gets_smaller_batches(
    default_limit_server: NatsServer,
) -> None:
    log = await EventLog.connect(default_limit_server.url, name="test-batch-limit", create=True)
    try:
        assert log.max_batch == MAX_BATCH > SERVER_DEFAULT_BATCH
        with pytest.raises(BatchTooLarge) as refused:
            await log.append_batch(_binds("a", SERVER_DEFAULT_BATCH + 1), source="test")
        assert refused.value.limit == log.max_batch == SERVER_DEFAULT_BATCH
        assert await log.last_seq() == 0  # nothing of the refused batch was stored
        # The writer splits a cycle's writes at the limit the server named, in order, fenced as ever.
        writes = [*_binds("b", 2 * SERVER_DEFAULT_BATCH + 5), _queued("q")]
        writer = _writer(log, 0)
        log.max_batch = MAX_BATCH  # as a fresh connection starts: it learns the limit from the refusal
        assert await writer.append_many(writes) == len(writes) == await log.last_seq()
        assert [msg_id for _, _, msg_id in await _stored(log)] == [w.msg_id for w in writes]
        assert log.max_batch == SERVER_DEFAULT_BATCH
    finally:
        await log.close()
