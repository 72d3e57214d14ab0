"""Leader lease on a JetStream KV bucket with a TTL: "probably the leader", never a safety guarantee.

Safety comes from the log: a new leader appends ``LeaderEpochStarted`` conditionally on the
``rally.sched.>`` tree, which makes every older leader's next conditional append fail (see
docs/architecture.md, "Scheduler fencing"). The lease only keeps two schedulers from fighting all
the time, and hands over within about one TTL when the leader dies.

Mechanics: the bucket's TTL is its stream's ``max_age``, so a key not rewritten for ``ttl`` seconds
expires. The leader holds the key created with ``kv.create`` (fails when it exists) and rewrites it
every ``ttl/3`` with ``kv.update(last=revision)`` (fails when anybody else wrote it since). A leader
that cannot renew for ``0.8 * ttl`` by its own clock declares the lease lost *before* the server
could hand it to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

_log = logging.getLogger(__name__)

LEADER_BUCKET = "rally-leader"
SAFETY_FRACTION = 0.8  # give up leadership after this share of the TTL without a successful renew
_DUE_RETRY_S = 0.05  # a contender's retry period once the holder's key is due to expire

_NO_ANSWER = (
    nats.errors.TimeoutError,
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
)


class LeaderLease:
    """One contender for the lease ``key`` in bucket ``rally-leader``.

    ``epoch`` is the KV revision of the winning ``create``: it grows with every new term while the
    bucket exists, so it can number ``LeaderEpochStarted`` (take the max with the last epoch in the
    log if the bucket may have been recreated).
    """

    def __init__(
        self,
        kv: KeyValue,
        *,
        key: str,
        holder: str,
        ttl: float,
        js: JetStreamContext | None = None,
        bucket: str = LEADER_BUCKET,
    ) -> None:
        self.kv = kv
        # where the key's last write is read with its store time (``_until_due``); None: poll only
        self._js = js
        self._bucket = bucket
        self.key = key
        self.holder = holder
        self.ttl = ttl
        self.epoch: int | None = None
        self.lost = asyncio.Event()
        self._revision: int | None = None
        self._last_renewed = 0.0
        self._renewer: asyncio.Task[None] | None = None
        # Set when the renewals must stop (resign, abandon): the renewer checks it as well as being
        # cancelled, since Python 3.11's asyncio.wait_for (under nats-py's request) can swallow a
        # cancellation that lands as its answer arrives, and a renewer that went on renewing kept a
        # released partition's lease alive forever, its owner's round stuck awaiting it (seen on a loaded
        # three-server cluster: half of a job controller's partitions owned by nobody)
        self._renewing = False

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        holder: str,
        key: str = "scheduler",
        bucket: str = LEADER_BUCKET,
        ttl: float = 3.0,
        replicas: int = 1,
    ) -> LeaderLease:
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(
                KeyValueConfig(bucket=bucket, ttl=ttl, history=1, storage=StorageType.FILE, replicas=replicas)
            )
        status = await kv.status()
        if status.ttl and abs(status.ttl - ttl) > 1e-3:
            # The bucket's TTL wins (it is server-side); renewing on our cadence would be wrong.
            _log.warning("bucket %s has ttl %.2fs, not %.2fs; using the bucket's", bucket, status.ttl, ttl)
            ttl = status.ttl
        return cls(kv, key=key, holder=holder, ttl=ttl, js=js, bucket=bucket)

    @property
    def is_leader(self) -> bool:
        return self._revision is not None and not self.lost.is_set()

    async def try_acquire(self) -> bool:
        """One attempt to take the lease; True if we hold it now."""
        if self.is_leader:
            return True
        started = time.monotonic()
        try:
            revision = await self.kv.create(self.key, self.holder.encode())
        except (
            nats.js.errors.KeyWrongLastSequenceError,
            nats.js.errors.KeyNotFoundError,
            nats.js.errors.KeyDeletedError,
        ):
            # Held by someone else; or (KeyNotFound/Deleted) the key expired or was deleted while
            # nats-py's create() was retrying over a tombstone (GUIDE §6): try again next round.
            return False
        except nats.js.errors.APIError as exc:
            if exc.err_code in (10071, 10164):
                return False
            raise
        except _NO_ANSWER:
            return False
        self._revision = revision
        self.epoch = revision
        self._last_renewed = started
        self.lost = asyncio.Event()
        self._renewing = True
        self._renewer = asyncio.create_task(self._renew_loop(), name=f"lease-{self.key}-{self.holder}")
        _log.info("won lease %s as %s (epoch %d)", self.key, self.holder, revision)
        return True

    async def campaign(self, stop: asyncio.Event | None = None, *, poll: float | None = None) -> int | None:
        """Try until we lead (returns the epoch) or ``stop`` is set (returns None)."""
        interval = poll if poll is not None else self.ttl / 4
        while stop is None or not stop.is_set():
            if await self.try_acquire():
                return self.epoch
            wait = await self._until_due(interval)
            if stop is None:
                await asyncio.sleep(wait)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        return None

    async def _until_due(self, interval: float) -> float:
        """How long to wait before the next try: ``interval``, or less when the holder's last write
        expires sooner. A dead leader's key goes one TTL after its last renewal, so trying right then,
        not up to a poll later, is what keeps a failover near one TTL (the server expires it a little
        after, hence the short retries once it is due)."""
        if self._js is None:
            return interval
        try:
            # from the stream's leader, with the time it stored the key's last write
            last = await self._js.get_msg(f"KV_{self._bucket}", subject=f"$KV.{self._bucket}.{self.key}")
        except nats.js.errors.NotFoundError:
            return _DUE_RETRY_S  # gone already: try again at once
        except Exception:  # no answer: the usual poll
            return interval
        if last.headers and last.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return _DUE_RETRY_S  # resigned: free now
        if last.time is None:
            return interval
        due = last.time.timestamp() + self.ttl - time.time()
        return min(interval, max(_DUE_RETRY_S, due))

    async def renew(self) -> bool:
        """Rewrite the key if it is still ours; on failure the lease is lost (``lost`` is set)."""
        if self._revision is None or self.lost.is_set():
            return False
        started = time.monotonic()
        try:
            self._revision = await self.kv.update(self.key, self.holder.encode(), last=self._revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            self._mark_lost("someone else wrote the lease key")
            return False
        except nats.js.errors.APIError as exc:
            if exc.err_code in (10071, 10164):
                self._mark_lost(f"lease update refused ({exc.err_code})")
                return False
            raise
        self._last_renewed = started
        return True

    async def _renew_loop(self) -> None:
        period = self.ttl / 3
        clock = asyncio.get_running_loop().time
        while not self.lost.is_set() and self._renewing:
            # On a grid of the period shared by every lease of the process: a replica's 32 partition
            # leases then renew in the same turn of the loop, their updates leaving in one write and their
            # answers coming back in one read, instead of 32 wake-ups each period (~150 us of CPU apiece
            # apart, measured). Never later than one period after the last renewal.
            await asyncio.sleep(period - clock() % period)
            if not self._renewing:
                return
            try:
                await self.renew()
            except _NO_ANSWER as exc:
                _log.warning("lease %s renew got no answer (%s)", self.key, type(exc).__name__)
            except Exception:
                _log.exception("lease %s renew failed", self.key)
            if not self.lost.is_set() and time.monotonic() - self._last_renewed > SAFETY_FRACTION * self.ttl:
                self._mark_lost("could not renew within the safety margin")

    def _mark_lost(self, why: str, level: int = logging.WARNING) -> None:
        if not self.lost.is_set():
            _log.log(level, "lost lease %s as %s (epoch %s): %s", self.key, self.holder, self.epoch, why)
            self.lost.set()

    def abandon(self) -> None:
        """Stop renewing without deleting the key (what a crash looks like; for tests and shutdown)."""
        self._renewing = False
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        self._mark_lost("abandoned")

    async def resign(self) -> None:
        """Stop renewing and delete the key if it is still ours, so a successor need not wait the TTL.
        The renewer is waited for at most one TTL: one that swallowed its cancellation ends at its next
        round (``_renewing``), and the key is deleted regardless."""
        revision = self._revision
        was_leader = self.is_leader
        self._renewing = False
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait({self._renewer}, timeout=self.ttl)
            self._renewer = None
        if was_leader:
            self._mark_lost("resigned", logging.INFO)  # asked for: a partitioned service gives up dozens
        self._revision = None
        if was_leader and revision is not None:
            with contextlib.suppress(Exception):  # best effort: the TTL hands it over anyway
                await self.kv.delete(self.key, last=revision)
            _log.info("resigned lease %s as %s", self.key, self.holder)
