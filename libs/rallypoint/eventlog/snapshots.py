"""Service snapshots in JetStream object stores: start from (seq, state) plus the tail of the log.

An object store rather than a KV bucket because hot state runs to tens of MB and a KV value is one
message (1 MB by default); the object store chunks it. The log position and the state's hash ride in the
object's headers. A snapshot is only an optimisation: losing or distrusting one means replaying from seq 1.

Each role keeps its own snapshot in a bucket of its own (``snapshot_bucket``), which only that role may
write, and records each save in the log (``SnapshotTaken`` on ``rally.snap.<role>``, which only that role
may write either). A reader believes an object only when the role's last record names its sequence, its
hash and this fold's version (``refusal``): a planted or stale object is replayed over, never restored.

A bucket holds two objects (``SNAPSHOT_SLOTS``) and a save never overwrites the one the log vouches for: a
service killed between writing an object and recording it (likely on a loaded machine, where saves are
slow) still starts from the snapshot before, instead of replaying the whole log.
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

#: The objects of each role's bucket: the one the log vouches for and the one the next save replaces.
SNAPSHOT_SLOTS = ("cluster-state", "cluster-state-b")
#: The first slot, the one object of a bucket written before there were two.
SNAPSHOT_OBJECT = SNAPSHOT_SLOTS[0]
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
        """Write ``state`` into the slot the log does not vouch for, then record it in the log: the object
        first, so a record never names an object that was not written (a save that fails between the two
        leaves an object no reader believes, beside the one the log still vouches for)."""
        slot = await self._free_slot(await last_record(log, self.role))
        headers = {_SEQ_HEADER: str(state.seq), _HASH_HEADER: state.state_hash}
        await self._store.put(slot, state.payload, meta=ObjectMeta(name=slot, headers=headers))
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

    async def load(self, seq: int | None = None) -> StateSnapshot | None:
        """The snapshot at ``seq`` when a slot holds it (the position the log vouches for), else the
        newest one (which the caller then checks against the log and may refuse); None when empty."""
        positions = await self._slot_positions()
        if not positions:
            return None
        at_seq = [slot for slot, position in positions.items() if position == seq]
        slot = at_seq[0] if at_seq else max(positions, key=lambda name: positions[name])
        try:
            result = await self._store.get(slot)
        except nats.js.errors.ObjectNotFoundError:
            return None  # replaced between the two reads: the caller replays, as for no snapshot
        info = result.info
        headers = info.headers if info is not None and info.headers else {}
        raw_seq = _header(headers, _SEQ_HEADER)
        if raw_seq is None or not raw_seq.isdigit():
            return None
        return StateSnapshot(int(raw_seq), _header(headers, _HASH_HEADER) or "", result.data or b"")

    async def _slot_positions(self) -> dict[str, int]:
        """Each slot holding an object of ours -> the log position it was saved at (headers only)."""
        positions: dict[str, int] = {}
        for slot in SNAPSHOT_SLOTS:
            try:
                info = await self._store.get_info(slot)
            except nats.js.errors.ObjectNotFoundError:
                continue
            raw_seq = _header(info.headers or {}, _SEQ_HEADER)
            if raw_seq is not None and raw_seq.isdigit():  # not written by us: ignore, never guess
                positions[slot] = int(raw_seq)
        return positions

    async def _free_slot(self, record: SnapshotTaken | None) -> str:
        """The slot the next save may replace: not the one holding the position ``record`` vouches for;
        of two that hold nothing vouched for, the older (an empty slot first)."""
        positions = await self._slot_positions()
        vouched = record.seq if record is not None else None
        # Both slots at the vouched position (two replicas saved there): either may go.
        free = [slot for slot in SNAPSHOT_SLOTS if positions.get(slot) != vouched] or list(SNAPSHOT_SLOTS)
        return min(free, key=lambda slot: positions.get(slot, -1))


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
