"""A job's secret values, outside the log: JetStream KV ``rally-secrets``, one key per job id.

The log is read whole by every service and kept forever; a secret in it would reach every reader and
every export. So a submission's ``secrets`` go here (the API writes them before it appends the
``JobSubmitted``, whose spec keeps their names only), the job controller reads them into each launch
request, and purges the key once the job has ended. NATS permissions keep everyone else out
(``security.permissions``); the values are stored as the NATS server stores any message (encrypted at
rest only if the server's JetStream is configured to be).

Nothing here logs, formats or raises with a value: errors name the job, never what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from rallypoint.security.permissions import SECRETS_BUCKET

_values = msgspec.json.Decoder(dict[str, str])
#: a key never written, and one purged (a purge marker reads as deleted)
_ABSENT = (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError)


class SecretsConflict(Exception):
    """The job's key holds other values than a retry of its submission sent."""


class SecretStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(
        cls, js: JetStreamContext, *, bucket: str = SECRETS_BUCKET, replicas: int = 1, create: bool = True
    ) -> SecretStore:
        """The bucket, created when missing and ``create`` (the admin's setup; a test's unsecured server).
        A service's identity may not create it: on a secured server it fails loudly if setup did not."""
        try:
            return cls(await js.key_value(bucket))
        except nats.js.errors.BucketNotFoundError:
            if not create:
                raise
        # direct gets: a read answered by any replica, and the one read the permission matrix grants
        config = KeyValueConfig(
            bucket=bucket, history=1, storage=StorageType.FILE, replicas=replicas, direct=True
        )
        return cls(await js.create_key_value(config))

    async def store(self, job_id: str, secrets: Mapping[str, str]) -> None:
        """Keep ``secrets`` for ``job_id``. A second store for the same job (a retried submission) is
        accepted when it holds the same values and raises ``SecretsConflict`` otherwise: the first
        values are the ones the job runs with, and are never replaced."""
        try:
            await self._kv.create(job_id, msgspec.json.encode(dict(secrets)))
        except nats.js.errors.KeyWrongLastSequenceError:
            if await self.read(job_id) != dict(secrets):
                raise SecretsConflict(f"job {job_id} already has other secret values") from None

    async def read(self, job_id: str) -> dict[str, str] | None:
        """The job's secrets; None when it has none stored (never stored, purged, or the bucket was lost
        and recreated)."""
        try:
            entry = await self._kv.get(job_id)
        except _ABSENT:
            return None
        return _values.decode(entry.value or b"{}")

    async def forget(self, job_id: str) -> bool:
        """Purge the job's key and every revision of it; False when there was nothing to purge."""
        try:
            await self._kv.get(job_id)
        except _ABSENT:
            return False
        await self._kv.purge(job_id)
        return True
