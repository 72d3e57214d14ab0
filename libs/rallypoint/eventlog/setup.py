"""Setting the log up: what the admin identity creates before any service starts (``rally nats setup``).

Services may not create, update, delete or purge streams (``rallypoint.security.permissions``): they find
the stream and buckets made here, and a service that finds no stream fails at start, loudly.
"""

from __future__ import annotations

import contextlib

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from rallypoint.security.permissions import LEADER_BUCKET, PARTITION_BUCKET, SNAPSHOT_ROLES

from .log import EventLog
from .secretstore import SecretStore
from .snapshots import SnapshotStore

#: The leader lease's TTL in the bucket; services asking for another one use the bucket's (runtime.leader).
LEASE_TTL_S = 3.0
#: Partitioned services' presence and partition leases (runtime.partitions): a killed replica's partitions
#: are taken about this long after its last renewal.
PARTITION_TTL_S = 1.2
SHARED_SNAPSHOT_BUCKET = "rally-snapshots"


async def setup_log(nc: Client, *, replicas: int = 1, lease_ttl: float = LEASE_TTL_S) -> EventLog:
    """Create (or bring to our configuration) the ``RALLY`` stream, the leader-lease bucket and each
    snapshotting role's own snapshot bucket, with ``replicas`` replicas each. Idempotent; needs a user
    allowed to create streams."""
    log = await EventLog.attach(nc, replicas=replicas, create=True)
    js = nc.jetstream()
    try:
        await js.key_value(LEADER_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        await js.create_key_value(
            KeyValueConfig(
                bucket=LEADER_BUCKET, ttl=lease_ttl, history=1, storage=StorageType.FILE, replicas=replicas
            )
        )
    await open_partition_bucket(js, replicas=replicas)
    for role in SNAPSHOT_ROLES:
        await SnapshotStore.open(js, role, replicas=replicas, create=True)
    await SecretStore.open(js, replicas=replicas, create=True)  # jobs' secret values (secretstore)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        # The one bucket every service once shared (and any could write): nobody reads it any more.
        await js.delete_object_store(SHARED_SNAPSHOT_BUCKET)
    return log


async def open_partition_bucket(
    js: JetStreamContext, *, ttl: float = PARTITION_TTL_S, replicas: int = 1
) -> KeyValue:
    """The partitioned services' presence and lease bucket (``runtime.partitions``); made if missing."""
    try:
        return await js.key_value(PARTITION_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        config = KeyValueConfig(
            bucket=PARTITION_BUCKET, ttl=ttl, history=1, storage=StorageType.FILE, replicas=replicas
        )
        return await js.create_key_value(config)
