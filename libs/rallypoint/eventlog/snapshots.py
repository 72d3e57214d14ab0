"""Service snapshots in a JetStream object store: start from (seq, state) plus the tail of the log.

An object store rather than a KV bucket because hot state runs to tens of MB and a KV value is one
message (1 MB by default); the object store chunks it. The log position rides in the object's headers.
A snapshot is only an optimisation: losing or distrusting one means replaying from seq 1.
"""

from __future__ import annotations

import nats.js.errors
from nats.js.api import ObjectMeta, StorageType
from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

SNAPSHOT_BUCKET = "rally-snapshots"
_SEQ_HEADER = "Rally-Seq"


class SnapshotStore:
    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    @classmethod
    async def open(
        cls, js: JetStreamContext, *, bucket: str = SNAPSHOT_BUCKET, replicas: int = 1, create: bool = True
    ) -> SnapshotStore:
        try:
            return cls(await js.object_store(bucket))
        except nats.js.errors.BucketNotFoundError:
            if not create:
                raise
        return cls(await js.create_object_store(bucket, storage=StorageType.FILE, replicas=replicas))

    async def save(self, service: str, seq: int, payload: bytes) -> None:
        """Replace ``service``'s snapshot with ``payload``, the state after applying event ``seq``."""
        meta = ObjectMeta(name=service, headers={_SEQ_HEADER: str(seq)})
        await self._store.put(service, payload, meta=meta)

    async def load(self, service: str) -> tuple[int, bytes] | None:
        try:
            result = await self._store.get(service)
        except nats.js.errors.ObjectNotFoundError:
            return None
        info = result.info
        headers = info.headers if info is not None and info.headers else {}
        raw_seq = headers.get(_SEQ_HEADER)
        if raw_seq is None:
            return None  # not written by us: ignore rather than guess a position
        value = raw_seq[0] if isinstance(raw_seq, list) else raw_seq
        return int(value), result.data or b""
