"""Service snapshots in JetStream object stores: start from (seq, state) plus the tail of the log.

An object store rather than a KV bucket because hot state runs to tens of MB and a KV value is one
message (1 MB by default); the object store chunks it. The log position and the state's hash ride in the
object's headers. A snapshot is only an optimisation: losing or distrusting one means replaying from seq 1.

Each role keeps its own snapshot in a bucket of its own (``snapshot_bucket``), which only that role may
write, and records each save in the log (``SnapshotTaken`` on ``rally.snap.<role>``, which only that role
may write either). A reader believes an object only when the role's last record names its sequence, its
hash and this fold's version (``refusal``): a planted or stale object is replayed over, never restored.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import nats.js.errors
from nats.js.api import ObjectMeta, StorageType
from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

from rallypoint.events import SnapshotTaken, subjects
from rallypoint.security.permissions import snapshot_bucket

from .log import EventLog

#: The one object in each role's bucket.
SNAPSHOT_OBJECT = "cluster-state"
_SEQ_HEADER = "Rally-Seq"
_HASH_HEADER = "Rally-State-Hash"


class StateSnapshot(NamedTuple):
    """What a bucket holds: the state after applying ``seq``, encoded, and the hash its writer gave it."""

    seq: int
    state_hash: str
    payload: bytes


class SnapshotStore:
    """One role's snapshot: its own bucket, of which it is the only writer."""

    def __init__(self, store: ObjectStore, role: str) -> None:
        self._store = store
        self.role = role

    @classmethod
    async def open(
        cls, js: JetStreamContext, role: str, *, replicas: int = 1, create: bool = True
    ) -> SnapshotStore:
        bucket = snapshot_bucket(role)
        try:
            return cls(await js.object_store(bucket), role)
        except nats.js.errors.BucketNotFoundError:
            if not create:
                raise
        return cls(await js.create_object_store(bucket, storage=StorageType.FILE, replicas=replicas), role)

    async def save(self, log: EventLog, state: StateSnapshot, fold_version: int) -> None:
        """Replace the role's snapshot with ``state``, then record it in the log: the object first, so a
        record never names an object that was not written (a save that fails between the two leaves an
        object no reader believes, which the next save replaces)."""
        headers = {_SEQ_HEADER: str(state.seq), _HASH_HEADER: state.state_hash}
        await self._store.put(
            SNAPSHOT_OBJECT, state.payload, meta=ObjectMeta(name=SNAPSHOT_OBJECT, headers=headers)
        )
        record = SnapshotTaken(
            role=self.role,
            seq=state.seq,
            state_hash=state.state_hash,
            fold_version=fold_version,
            at=time.time(),
        )
        # One id per position: a retried append, or two replicas saving at one position, store it once.
        msg_id = f"{self.role}:snap:{state.seq}"
        await log.append(subjects.snapshot_taken(self.role), record, msg_id=msg_id, source=self.role)

    async def load(self) -> StateSnapshot | None:
        try:
            result = await self._store.get(SNAPSHOT_OBJECT)
        except nats.js.errors.ObjectNotFoundError:
            return None
        info = result.info
        headers = info.headers if info is not None and info.headers else {}
        raw_seq = _header(headers, _SEQ_HEADER)
        if raw_seq is None or not raw_seq.isdigit():
            return None  # not written by us: ignore rather than guess a position
        return StateSnapshot(int(raw_seq), _header(headers, _HASH_HEADER) or "", result.data or b"")


def _header(headers: dict[str, str] | dict[str, list[str]], name: str) -> str | None:
    value = headers.get(name)
    return value[0] if isinstance(value, list) else value


async def last_record(log: EventLog, role: str) -> SnapshotTaken | None:
    """The last ``SnapshotTaken`` the log holds on ``role``'s subject (None: the role never recorded one)."""
    subject = subjects.snapshot_taken(role)
    seq = await log.last_seq(subject)
    if seq == 0:
        return None
    recorded = await log.get(seq)
    event = recorded.event
    return event if isinstance(event, SnapshotTaken) and recorded.subject == subject else None


def refusal(record: SnapshotTaken, seq: int, fold_version: int) -> str | None:
    """Why the role's last ``record`` does not vouch for the object saved at ``seq`` (checked before the
    object is decoded), or None: it must be of this fold version and name that position."""
    if record.fold_version != fold_version:
        return f"recorded by fold version {record.fold_version}; this fold is version {fold_version}"
    if record.seq != seq:
        return f"the object is at seq {seq}, the last SnapshotTaken at seq {record.seq}"
    return None
