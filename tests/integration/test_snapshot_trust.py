"""Snapshots cannot lie (issue 30): a role's snapshot is its own, and a reader believes it only when the log
vouches for it. On real nats-servers: one secured with the accounts the local cluster renders from the
permission matrix, where it matters who may write; the session's open one for what a reader checks.

The attack of the issue: the API's bus identity saved a planted state (every node drained) as the snapshot
the schedulers restored, and they scheduled nothing until an admin deleted it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import ObjectMeta
from nats.js.object_store import ObjectStore
from rallypoint_services.api.fold import FoldFollower

from rallypoint.eventlog import EventLog, NatsCredentials, Recorded, SnapshotStore, connect_nats
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import (
    Event,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    NodeDrained,
    NodeRegistered,
    SnapshotTaken,
    encode,
    subjects,
)
from rallypoint.events.codec import Quarantined
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower
from rallypoint.security import ADMIN
from rallypoint.security.credentials import LocalCredentials
from rallypoint.security.natsconf import literal, render_accounts
from rallypoint.security.permissions import SNAPSHOT_ROLES, snapshot_bucket
from rallypoint.state import FOLD_VERSION, ClusterState

NODES = ("node-a", "node-b")
# A refused JetStream call or publish is dropped by the server: the client waits this long for nothing.
REFUSED_TIMEOUT_S = 1.0
WAIT_S = 30.0


# -- histories and forgeries --------------------------------------------------------------------------


async def _history(log: EventLog, jobs: int) -> None:
    """Both nodes registered (up), then ``jobs`` submissions."""
    gpus = tuple(GpuInfo(index=i, uuid=f"u{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    for node_id in NODES:
        registered = NodeRegistered(
            node_id=node_id, address="a", rack="r", gpu_type="g", gpus=gpus, cpu_milli=1, memory_mib=1,
            agent_instance="i", at=0.0,
        )  # fmt: skip
        await log.append(subjects.node_registration(node_id), registered, msg_id=f"{node_id}:reg", source="t")
    await _submit(log, 0, jobs)


async def _submit(log: EventLog, first: int, count: int) -> None:
    spec = JobSpec(name="j", team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
    for i in range(first, first + count):
        job = JobSubmitted(job_id=f"j{i}", spec=spec, submitted_at=float(i))
        await log.append(subjects.job(f"j{i}"), job, msg_id=f"j{i}:0:JobSubmitted", source="t")


def _every_node_drained(state: ClusterState) -> ClusterState:
    """The planted state of the issue: the fold at the same position, with every node drained."""
    planted = ClusterState.decode(state.encode())
    for node_id in NODES:
        planted.apply(state.last_seq, NodeDrained(node_id=node_id, reason="planted", at=1.0))
    assert planted.last_seq == state.last_seq and planted.hash() != state.hash()
    return planted


async def _plant(js_store: ObjectStore, seq: int, state_hash: str, payload: bytes) -> None:
    """What a forger with write access to a bucket writes: the object and headers a save writes, no record."""
    headers = {"Rally-Seq": str(seq), "Rally-State-Hash": state_hash}
    await js_store.put("cluster-state", payload, meta=ObjectMeta(name="cluster-state", headers=headers))


async def _folded(log: EventLog) -> Follower:
    follower = Follower(log)
    await follower.catch_up()
    return follower


class CountingFollower(Follower):
    """A Follower that remembers the sequences it folded itself (not those a snapshot brought)."""

    def __init__(self, log: EventLog) -> None:
        super().__init__(log)
        self.applied: list[int] = []

    def apply(self, seq: int, item: Event | Quarantined) -> None:
        self.applied.append(seq)
        super().apply(seq, item)


async def _first_record(log: EventLog, role: str) -> SnapshotTaken:
    """The first SnapshotTaken ``role`` appends (waits for it)."""
    async for rec in log.follow(from_seq=1, subjects=subjects.snapshot_taken(role)):
        assert isinstance(rec, Recorded) and isinstance(rec.event, SnapshotTaken)
        return rec.event
    raise AssertionError("the follow ended")


# -- a reader checks ----------------------------------------------------------------------------------


@pytest.fixture
async def store(event_log: EventLog) -> AsyncIterator[SnapshotStore]:
    role = f"role-{uuid.uuid4().hex[:12]}"  # a bucket no other test on the session's server uses
    snapshots = await SnapshotStore.open(event_log.js, role)
    try:
        yield snapshots
    finally:
        await event_log.js.delete_object_store(snapshot_bucket(role))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def _ignored(log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture) -> str:
    """Restore must refuse the role's snapshot and warn why; a fold from the log then gives the state a
    full replay gives. Returns the warning."""
    caplog.set_level(logging.WARNING, logger="rallypoint.follower")
    caplog.clear()
    follower = Follower(log)
    assert not await follower.restore(store)
    assert follower.state.last_seq == 0
    await follower.catch_up()
    full = await _folded(log)
    assert follower.state.hash() == full.state.hash()
    assert {node.status for node in follower.state.nodes.values()} == {"up"}
    (warning,) = _warnings(caplog)
    assert f"ignoring the {store.role} snapshot" in warning and "folding from the log" in warning
    return warning


async def test_a_planted_snapshot_without_a_record_is_ignored(
    event_log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _history(event_log, 5)
    honest = await _folded(event_log)
    planted = _every_node_drained(honest.state)
    bucket = await event_log.js.object_store(snapshot_bucket(store.role))
    await _plant(bucket, planted.last_seq, planted.hash(), planted.encode())  # its own hash, even

    warning = await _ignored(event_log, store, caplog)
    assert "the log holds no SnapshotTaken for it" in warning


async def test_a_snapshot_the_recorded_hash_does_not_match_is_ignored(
    event_log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A genuine save recorded seq S and its hash; the object is then replaced by another state at S."""
    await _history(event_log, 5)
    honest = await _folded(event_log)
    assert await honest.save(store) == 7
    planted = _every_node_drained(honest.state)
    bucket = await event_log.js.object_store(snapshot_bucket(store.role))
    await _plant(bucket, 7, honest.state.hash(), planted.encode())  # the genuine hash in its header

    warning = await _ignored(event_log, store, caplog)
    assert f"hashes to {planted.hash()}" in warning and honest.state.hash() in warning


async def test_a_snapshot_at_another_position_than_the_record_is_ignored(
    event_log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The last record names seq 7; the object holds a genuine fold at a later seq that nobody recorded
    (a save whose record never landed, or a replayed object)."""
    await _history(event_log, 5)
    assert await (await _folded(event_log)).save(store) == 7
    await _submit(event_log, 5, 3)
    later = await _folded(event_log)
    bucket = await event_log.js.object_store(snapshot_bucket(store.role))
    await _plant(bucket, later.state.last_seq, later.state.hash(), later.state.encode())

    warning = await _ignored(event_log, store, caplog)
    assert f"the object is at seq {later.state.last_seq}, the last SnapshotTaken at seq 7" in warning


async def test_a_snapshot_recorded_by_another_fold_version_is_ignored(
    event_log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _history(event_log, 5)
    honest = await _folded(event_log)
    await honest.save(store)
    older = SnapshotTaken(
        role=store.role, seq=7, state_hash=honest.state.hash(), fold_version=FOLD_VERSION - 1, at=2.0
    )
    await event_log.append(subjects.snapshot_taken(store.role), older, msg_id="older", source="t")

    warning = await _ignored(event_log, store, caplog)
    assert f"recorded by fold version {FOLD_VERSION - 1}; this fold is version {FOLD_VERSION}" in warning


async def test_a_genuine_snapshot_is_restored_and_its_prefix_not_replayed(
    event_log: EventLog, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rallypoint.follower")
    await _history(event_log, 5)
    assert await (await _folded(event_log)).save(store) == 7  # recorded at seq 8
    await _submit(event_log, 5, 4)  # seqs 9..12

    restarted = CountingFollower(event_log)
    assert await restarted.restore(store)
    assert restarted.state.last_seq == 7
    await restarted.catch_up()
    assert restarted.applied == list(range(8, 13))  # the record and the tail: nothing of the prefix
    assert restarted.state.hash() == (await _folded(event_log)).state.hash()
    assert not _warnings(caplog)


async def test_a_save_gives_the_loop_back_while_it_hashes_and_the_fold_holds_still(
    event_log: EventLog, store: SnapshotStore
) -> None:
    """A large fold is hashed in pieces (a second of CPU at 12,500 nodes): the loop runs other tasks
    between them (partition leases are renewed there), and the follow applies nothing until the hash is
    done, so the object and its recorded hash are of one position."""
    await _history(event_log, 1_000)  # 1,000 jobs: several pieces of 256 between two yields
    follower = await _folded(event_log)
    follow = asyncio.create_task(follower.run())
    during: list[int] = []  # the fold's position each time another task ran while the save hashed
    saving = True

    async def watch() -> None:
        while saving:
            if follower._thawed is not None:
                during.append(follower.state.last_seq)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    more = asyncio.create_task(_submit(event_log, 1_000, 20))  # arrives while it hashes, or after
    try:
        seq = await follower.save(store)
    finally:
        saving = False
        await watcher
        await more
        follow.cancel()
    assert len(during) >= 2 and set(during) == {seq}, during
    # its own CPU, what spaces the next save (``events_before_next_save``): the other tasks' is not in it
    assert 0 < follower.save_cpu_s < 10.0
    restarted = CountingFollower(event_log)
    assert await restarted.restore(store) and restarted.state.last_seq == seq
    await restarted.catch_up()
    assert restarted.state.hash() == (await _folded(event_log)).state.hash()


async def test_the_api_saves_its_own_snapshot_and_restores_it(
    event_log: EventLog,
    store: SnapshotStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API no longer restores another service's snapshot: it keeps its own, as the services do."""
    monkeypatch.setenv("RALLY_SNAPSHOT_EVERY", "1")
    monkeypatch.setenv("RALLY_SNAPSHOT_CHECK_S", "0.05")
    caplog.set_level(logging.INFO, logger="rallypoint.api.fold")
    await _history(event_log, 3)
    first = FoldFollower(event_log, store)
    first.start()
    try:
        assert await first.wait_replayed(WAIT_S)
        await _submit(event_log, 3, 1)  # seq 6: saves come after new events, not at start
        record = await asyncio.wait_for(_first_record(event_log, store.role), WAIT_S)
    finally:
        await first.stop()
    assert record.seq == 6

    second = FoldFollower(event_log, store)
    second.start()
    try:
        assert await second.wait_replayed(WAIT_S)
    finally:
        await second.stop()
    assert "restored state at seq 6 from snapshot" in caplog.text
    assert second.state.hash() == (await _folded(event_log)).state.hash()


# -- only a snapshot's own writer may save it ---------------------------------------------------------


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, LocalCredentials]]:
    credentials = LocalCredentials.generate(NODES)
    accounts = render_accounts(NODES, password=literal(credentials.passwords))
    server = await NatsServer(tmp_path / "nats", accounts=accounts).astart()
    try:
        admin = await _connect(server, credentials, ADMIN)
        await setup_log(admin)
        await admin.close()
        yield server, credentials
    finally:
        await server.astop()


async def _connect(server: NatsServer, credentials: LocalCredentials, user: str) -> Client:
    creds = NatsCredentials(user, credentials.passwords[user])
    return await connect_nats(server.url, name=f"trust-{user}", credentials=creds)


async def _refused(coro: object) -> None:
    """A call the server drops: it gets no answer (or, at most, an error)."""
    with pytest.raises((nats.errors.TimeoutError, nats.js.errors.APIError, TimeoutError)):
        await coro  # type: ignore[misc]


async def test_a_role_cannot_write_another_roles_snapshot(
    secured: tuple[NatsServer, LocalCredentials],
) -> None:
    server, credentials = secured
    admin = await _connect(server, credentials, ADMIN)
    scheduler, api = (
        await _connect(server, credentials, "scheduler"),
        await _connect(server, credentials, "api"),
    )
    try:
        admin_log = await EventLog.attach(admin, create=False)
        await _history(admin_log, 3)
        # Each role saves its own snapshot through its own identity.
        scheduler_log = await EventLog.attach(scheduler, create=False)
        own = await SnapshotStore.open(scheduler.jetstream(), "scheduler", create=False)
        genuine = await _folded(scheduler_log)
        assert await genuine.save(own) == 5
        api_log = await EventLog.attach(api, create=False)
        api_own = await SnapshotStore.open(api.jetstream(), "api", create=False)
        assert await (await _folded(api_log)).save(api_own) == 6
        bucket_stream = f"OBJ_{snapshot_bucket('scheduler')}"
        before = (await admin.jetstream().stream_info(bucket_stream)).state

        # The API's identity tries to plant every node drained as the scheduler's snapshot, every way.
        planted = _every_node_drained(genuine.state)
        api_js = api.jetstream(timeout=REFUSED_TIMEOUT_S)
        await _refused(SnapshotStore.open(api_js, "scheduler", create=False))
        foreign = ObjectStore(name=snapshot_bucket("scheduler"), stream=bucket_stream, js=api_js)
        await _refused(_plant(foreign, 5, planted.hash(), planted.encode()))
        await _refused(api_js.purge_stream(bucket_stream))
        meta_subject = (
            f"$O.{snapshot_bucket('scheduler')}.M.{base64.urlsafe_b64encode(b'cluster-state').decode()}"
        )
        await api.publish(meta_subject, b"{}")
        vouch = SnapshotTaken(
            role="scheduler", seq=5, state_hash=planted.hash(), fold_version=FOLD_VERSION, at=3.0
        )
        await api.publish(subjects.snapshot_taken("scheduler"), encode(vouch))
        with contextlib.suppress(nats.errors.TimeoutError):
            await api.flush()

        after = (await admin.jetstream().stream_info(bucket_stream)).state
        assert (after.messages, after.last_seq) == (before.messages, before.last_seq), (
            "the bucket is untouched"
        )
        assert (
            await admin_log.last_seq(subjects.snapshot_taken("scheduler")) == 5 + 1
        )  # the scheduler's record
        restarted = Follower(scheduler_log)
        assert await restarted.restore(own)
        assert restarted.state.hash() == genuine.state.hash()
        assert {node.status for node in restarted.state.nodes.values()} == {"up"}
    finally:
        for nc in (admin, scheduler, api):
            await nc.close()


async def test_setup_makes_a_bucket_per_role_and_drops_the_shared_one(tmp_path: Path) -> None:
    async with NatsServer(tmp_path / "nats") as server:
        nc = await connect_nats(server.url, name="setup")
        try:
            js = nc.jetstream()
            await js.create_object_store(
                "rally-snapshots"
            )  # what an older setup made, any service's to write
            await setup_log(nc)
            await setup_log(nc)  # idempotent
            for role in SNAPSHOT_ROLES:
                await js.object_store(snapshot_bucket(role))
            with pytest.raises(nats.js.errors.BucketNotFoundError):
                await js.object_store("rally-snapshots")
        finally:
            await nc.close()
