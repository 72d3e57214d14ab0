"""A service's work in a fixed number of partitions, owned dynamically by its live replicas, fenced.

Membership: every replica rewrites a presence key ``<service>.member.<member>`` in the KV bucket
``rally-partitions`` (its TTL is the bucket's ``max_age``), so a killed replica's key is gone one TTL after
its last rewrite. Assignment: rendezvous hashing over the live members (``assigned``): every replica
computes the same owner for each partition from the same members, and a member's leaving moves only its
own partitions.

Ownership: a replica claims each partition assigned to it through the lease key ``<service>.lease.<p>``
(``LeaderLease``: ``kv.create``, then ``kv.update`` with the revision, a TTL, a safety margin), releases
the partitions the assignment moves away, and takes those of a killed replica once their leases expire
(within about one TTL). A lease only says "probably owner": before acting on a partition its new owner
appends ``LeaderEpochStarted`` (role ``<service>.<p>``) on the partition's epoch subject, conditional on
that subject's last sequence, and every later write it makes is conditional on that epoch event still
being the last one there (``FencedWriter`` with the epoch subject as its tree). So once a newer owner's
epoch is stored, a deposed owner's next append is refused by the server (``AppendConflict``) and the owner
drops the partition. Writes of one partition do not move its fence, but go one at a time (a clustered
stream refuses concurrent proposals that expect one subject sequence: ``FencedWriter``); the partitions
go in parallel.

A service that writes nothing needs neither leases nor epochs: ``WorkShare`` takes the same rendezvous
assignment over the same presence keys (``Membership``) and nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rallypoint.eventlog import AppendConflict, EventLog, EventLogError, LogUnavailable
from rallypoint.eventlog.setup import PARTITION_TTL_S, open_partition_bucket
from rallypoint.events import Event, subjects
from rallypoint.security.permissions import PARTITION_BUCKET

from .fencing import FencedWriter
from .follower import Follower
from .leader import _NO_ANSWER, LeaderLease

__all__ = [
    "PARTITION_BUCKET",
    "PARTITION_TTL_S",
    "Membership",
    "NotOwner",
    "PartitionOwnership",
    "PartitionsCollector",
    "WorkShare",
    "assigned",
    "member_name",
    "rendezvous",
]

_log = logging.getLogger("rallypoint.partitions")


class NotOwner(EventLogError):
    """Nothing was appended: this replica does not own the key's partition now."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key}: its partition is not ours now")


def member_name(instance: str) -> str:
    """A replica's name in the partitions' bucket: one key token (host-pid stays as it is)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", instance)


def _weight(member: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{member}/{partition}".encode(), digest_size=8).digest()


def rendezvous(partition: int, members: Iterable[str]) -> str | None:
    """The member with the highest weight for ``partition`` (None without members): the same answer on
    every replica that sees the same members, whatever order it lists them in."""
    return max(members, key=lambda m: (_weight(m, partition), m), default=None)


def assigned(member: str, members: Iterable[str], count: int) -> frozenset[int]:
    """The partitions ``member`` owns when ``members`` are the live ones."""
    everyone = sorted(set(members) | {member})
    return frozenset(p for p in range(count) if rendezvous(p, everyone) == member)


async def _partition_bucket(js: JetStreamContext, ttl: float) -> tuple[KeyValue, float]:
    """The bucket, and the TTL its keys live: the bucket's, once it exists."""
    kv = await open_partition_bucket(js, ttl=ttl)
    status = await kv.status()
    if status.ttl and abs(status.ttl - ttl) > 1e-3:
        _log.warning(
            "bucket %s has ttl %.2fs, not %.2fs; using the bucket's", PARTITION_BUCKET, status.ttl, ttl
        )
        ttl = status.ttl
    return kv, ttl


class Membership:
    """A service's live replicas, as one of them sees them: it rewrites its presence key
    ``<service>.member.<member>`` every TTL/3, and watches the others'. A killed replica's key is gone
    one TTL after its last rewrite; a replica that leaves cleanly deletes its own."""

    def __init__(self, kv: KeyValue, *, service: str, member: str, ttl: float) -> None:
        self.kv = kv
        self.service = service
        self.member = member
        self.ttl = ttl
        self.members: tuple[str, ...] = (member,)
        self._last_presence = float("-inf")
        self._presence_revision: int | None = None
        self._seen: dict[str, float] = {}  # member -> when its presence was last written (monotonic)
        self._watcher: KeyValue.KeyWatcher | None = None
        self._watching: asyncio.Task[None] | None = None
        self._read_stored = asyncio.Event()  # the watch has delivered what was stored when it began

    async def refresh(self) -> tuple[str, ...]:
        """Keep our presence, then the live members (``members``), this one included."""
        await self._keep_presence()
        self.members = await self._live_members()
        return self.members

    async def _keep_presence(self) -> None:
        if time.monotonic() - self._last_presence < self.ttl / 3:
            return
        started = time.monotonic()
        self._presence_revision = await self.kv.put(self._presence_key, self.member.encode())
        self._last_presence = started

    @property
    def _presence_key(self) -> str:
        return f"{self.service}.member.{self.member}"

    async def _live_members(self) -> tuple[str, ...]:
        """The members whose presence was written within the TTL (expiry writes nothing a watcher sees),
        this one included. One watcher for the replica's life: our own presence, rewritten every TTL/3,
        is its proof of life, and a watcher that stopped delivering it is replaced."""
        now = time.monotonic()
        if self._watching is None or now - self._seen.get(self.member, now) > self.ttl:
            await self._watch()
        # A new watch's first answer counts what was stored: without it a starting replica sees itself
        # alone for a round (a partitioned one only tries more claims; an unfenced one repeats work).
        if not self._read_stored.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read_stored.wait(), self.ttl)
            self._read_stored.set()  # waited once per watch, answer or not
        now = time.monotonic()
        for member in [m for m, at in self._seen.items() if now - at > 100 * self.ttl]:
            del self._seen[member]  # long gone: replicas come and go under new names (host-pid)
        live = {m for m, at in self._seen.items() if now - at < self.ttl}
        return tuple(sorted(live | {self.member}))

    async def _watch(self) -> None:
        await self.stop_watching()
        prefix = f"{self.service}.member."
        self._read_stored = asyncio.Event()
        # one ordered consumer, not one per round: each is a consumer the (R3) stream keeps for minutes
        self._watcher = await self.kv.watch(f"{prefix}*", meta_only=True)
        self._seen[self.member] = time.monotonic()  # the new watcher gets its chance to prove itself
        self._watching = asyncio.create_task(
            self._follow(self._watcher, prefix, self._read_stored), name=f"members-{self.member}"
        )

    async def _follow(self, watcher: KeyValue.KeyWatcher, prefix: str, read_stored: asyncio.Event) -> None:
        async for entry in watcher:
            if entry is None:  # the end of what was stored when the watch began
                read_stored.set()
                continue
            member = entry.key[len(prefix) :]
            if entry.operation is not None:  # a delete or purge: that member left cleanly
                self._seen.pop(member, None)
                continue
            age = max(0.0, time.time() - entry.created.timestamp()) if entry.created else 0.0
            self._seen[member] = time.monotonic() - age  # an old key, read at the start, is as old

    async def stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
            self._watcher = None

    def abandon(self) -> None:
        """Stop watching without a word: the presence key stays until it expires (a killed replica)."""
        if self._watching is not None:
            self._watching.cancel()

    async def leave(self) -> None:
        """Delete our presence key, so the others count us out at their next round, not after the TTL."""
        await self.stop_watching()
        with contextlib.suppress(Exception):  # best effort: the TTL removes it anyway
            await self.kv.delete(self._presence_key, last=self._presence_revision)


class PartitionOwnership:
    """One replica's share of ``service``'s ``count`` partitions: ``run`` keeps it; ``owns`` and
    ``writer_for`` tell the service what it may act on and how to write for it."""

    def __init__(
        self,
        kv: KeyValue,
        log: EventLog,
        follower: Follower,
        *,
        service: str,
        member: str,
        count: int,
        ttl: float,
        source: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kv = kv
        self.log = log
        self.follower = follower
        self.service = service
        self.member = member
        self.count = count
        self.ttl = ttl
        self.source = source
        self.clock = clock
        self.tick_s = ttl / 10
        self.leases: dict[int, LeaderLease] = {}  # held, fenced or being fenced
        self.writers: dict[int, FencedWriter] = {}  # fenced: the partitions this replica acts on
        self.generation = 0  # grows at every gain or loss
        self.listeners: list[Callable[[], None]] = []  # told at every gain or loss
        self.membership = Membership(kv, service=service, member=member, ttl=ttl)
        self._runner: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        log: EventLog,
        follower: Follower,
        *,
        service: str,
        member: str,
        count: int,
        source: str,
        ttl: float = PARTITION_TTL_S,
    ) -> PartitionOwnership:
        kv, ttl = await _partition_bucket(js, ttl)
        return cls(kv, log, follower, service=service, member=member, count=count, ttl=ttl, source=source)

    @property
    def members(self) -> tuple[str, ...]:
        """The live replicas at the last round, this one included."""
        return self.membership.members

    @property
    def owned(self) -> frozenset[int]:
        """The partitions this replica owns and fences now."""
        return frozenset(self.writers)

    # -- what the service asks ----------------------------------------------------------------------

    def partition_of(self, key: str) -> int:
        return subjects.partition_of(key, self.count)

    def owns(self, key: str) -> bool:
        return self.partition_of(key) in self.writers

    def writer_for(self, key: str) -> FencedWriter | None:
        """The fenced writer of ``key``'s partition, None when this replica does not own it now."""
        return self.writers.get(self.partition_of(key))

    def deposed(self, key: str, writer: FencedWriter) -> None:
        """A write for ``key`` was refused (a newer owner's epoch): stop acting on its partition at once."""
        partition = self.partition_of(key)
        if self.writers.get(partition) is writer:
            _log.warning("%s: partition %d was taken by a newer owner; dropping it", self.member, partition)
            self._drop(partition)

    async def append(self, key: str, subject: str, event: Event, msg_id: str) -> int:
        """Append for ``key``, fenced by the epoch of its partition's ownership: ``NotOwner`` when this
        replica does not own it now; ``AppendConflict`` (and the partition dropped) when a newer owner's
        epoch is stored."""
        writer = self.writer_for(key)
        if writer is None:
            raise NotOwner(key)
        try:
            return await writer.append(subject, event, msg_id)
        except AppendConflict:
            self.deposed(key, writer)
            raise

    # -- keeping the share ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Keep presence, claim what the assignment gives, release what it moves away; until ``stop``."""
        while not stop.is_set():
            try:
                await self.step()
            except _NO_ANSWER as exc:
                _log.warning("%s: partition round got no answer (%s)", self.member, type(exc).__name__)
            except Exception:
                _log.exception("%s: partition round failed", self.member)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick_s)

    def start(self, stop: asyncio.Event) -> asyncio.Task[None]:
        self._runner = asyncio.create_task(self.run(stop), name=f"partitions-{self.member}")
        return self._runner

    async def step(self) -> None:
        """One round: presence, the live members, then releases and claims."""
        members = await self.membership.refresh()
        want = assigned(self.member, members, self.count)
        for partition, lease in list(self.leases.items()):
            if lease.lost.is_set() or self._fenced_out(partition):
                self._drop(partition)
            elif partition not in want and partition in self.writers:
                await self._release(partition)
        missing = [p for p in sorted(want) if p not in self.leases]
        if missing:
            await asyncio.gather(*(self._claim(p) for p in missing))

    async def _claim(self, partition: int) -> None:
        lease = LeaderLease(
            self.kv, key=f"{self.service}.lease.{partition}", holder=self.member, ttl=self.ttl
        )
        if not await lease.try_acquire():
            return  # still another's (alive, or its lease has not expired yet): tried again next round
        self.leases[partition] = lease
        role = subjects.partition_role(self.service, partition)
        epoch_subject = subjects.epoch(role)
        writer = FencedWriter(
            self.log,
            self.follower,
            role=role,
            tree=epoch_subject,
            epoch_subject=epoch_subject,
            instance=self.member,
            source=self.source,
            clock=self.clock,
        )
        try:
            await writer.start_epoch(lease.epoch or 0)
        except (AppendConflict, LogUnavailable, TimeoutError) as exc:
            _log.warning("%s: could not fence partition %d (%s)", self.member, partition, exc)
            self.leases.pop(partition, None)
            await lease.resign()
            return
        if lease.is_leader and self.leases.get(partition) is lease:
            self.writers[partition] = writer
            self._changed()

    def _fenced_out(self, partition: int) -> bool:
        """A later epoch than ours is in the log for ``partition``: another claimant fenced it after us.

        Two replicas that lost their leases in one stall claim at once; one whose claim stalled again
        can append its epoch after the lease's new holder fenced the partition (its epoch is above the
        log's last, whatever its lease term), then find its lease gone and never act. The holder would
        not learn of it before its next write was refused, and a partition with no work pending would
        stay fenced against its own owner, the log naming a replica that holds nothing (seen in the
        cluster bench with two checkpoint replicas: no new epoch after that replica was killed). Its
        fold tells the holder at the next round: it drops the partition and its lease, and whoever the
        assignment names claims it anew once the key expires, with an epoch above both."""
        writer = self.writers.get(partition)
        return writer is not None and self.follower.state.epochs.get(writer.role, 0) > writer.epoch

    def _drop(self, partition: int) -> None:
        """Stop acting on ``partition`` now; its lease, if still held, is given up in the background."""
        self.writers.pop(partition, None)
        lease = self.leases.pop(partition, None)
        if lease is not None and lease.is_leader:
            lease.abandon()  # not deleted: a newer owner holds the partition, or will after the TTL
        self._changed()

    async def _release(self, partition: int) -> None:
        """Hand ``partition`` over: stop acting on it first, then delete its lease so its new owner need
        not wait for the TTL."""
        self.writers.pop(partition, None)
        lease = self.leases.pop(partition, None)
        self._changed()
        if lease is not None:
            await lease.resign()

    def _changed(self) -> None:
        self.generation += 1
        for listener in self.listeners:
            listener()

    # -- leaving ------------------------------------------------------------------------------------

    def abandon(self) -> None:
        """Stop at once without a word to anyone, as a killed replica would: its presence and leases stay
        until they expire (for tests and benchmarks)."""
        if self._runner is not None:
            self._runner.cancel()
        self.membership.abandon()
        for partition in list(self.leases):
            self._drop(partition)

    async def resign(self) -> None:
        """Leave cleanly: give every partition up and delete the presence key, so the others take over
        at their next round instead of after the TTL."""
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.wait([self._runner], timeout=self.ttl)  # a claim stuck on the log must not hold it
        await self.membership.stop_watching()
        for partition in list(self.leases):
            await self._release(partition)
        await self.membership.leave()


class WorkShare:
    """One replica's share of ``service``'s ``count`` partitions, unfenced: for a service that writes
    nothing (the preemption service's reports). No lease and no epoch: each replica takes the partitions
    ``assigned`` gives it over the members it sees now. While the members change (one starts, or one was
    killed and its presence has not expired yet) two replicas may both take a partition for a round, or
    neither: a report said twice, or a TTL late, never a write. A killed replica's partitions are taken
    by the others one TTL after its last presence, a cleanly stopped one's at their next round."""

    def __init__(self, kv: KeyValue, *, service: str, member: str, count: int, ttl: float) -> None:
        self.service = service
        self.member = member
        self.count = count
        self.membership = Membership(kv, service=service, member=member, ttl=ttl)
        self.tick_s = ttl / 10
        self.owned: frozenset[int] = frozenset()  # nothing before the first round has seen the others
        self._runner: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, js: JetStreamContext, *, service: str, member: str, count: int, ttl: float = PARTITION_TTL_S
    ) -> WorkShare:
        kv, ttl = await _partition_bucket(js, ttl)
        return cls(kv, service=service, member=member, count=count, ttl=ttl)

    @property
    def members(self) -> tuple[str, ...]:
        return self.membership.members

    def owns(self, key: str) -> bool:
        return subjects.partition_of(key, self.count) in self.owned

    async def step(self) -> None:
        members = await self.membership.refresh()
        owned = assigned(self.member, members, self.count)
        if owned != self.owned:
            _log.info(
                "%s: %d of %s's %d partitions, among %d replicas",
                self.member,
                len(owned),
                self.service,
                self.count,
                len(members),
            )
            self.owned = owned

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except _NO_ANSWER as exc:
                _log.warning("%s: membership round got no answer (%s)", self.member, type(exc).__name__)
            except Exception:
                _log.exception("%s: membership round failed", self.member)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick_s)

    def start(self, stop: asyncio.Event) -> asyncio.Task[None]:
        self._runner = asyncio.create_task(self.run(stop), name=f"share-{self.member}")
        return self._runner

    def abandon(self) -> None:
        """Stop at once, as a killed replica would: the presence key stays until it expires."""
        if self._runner is not None:
            self._runner.cancel()
        self.membership.abandon()
        self.owned = frozenset()

    async def resign(self) -> None:
        """Leave cleanly: own nothing, delete the presence key."""
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.wait([self._runner], timeout=self.membership.ttl)
        self.owned = frozenset()
        await self.membership.leave()


class _Share(Protocol):
    service: str
    member: str

    @property
    def members(self) -> tuple[str, ...]: ...
    @property
    def owned(self) -> frozenset[int]: ...


class PartitionsCollector(Collector):
    """``rally_partitions_owned{service, instance}``: the partitions this replica owns now, and
    ``rally_partition_members{service, instance}``: the live replicas it sees. Summed over the replicas,
    the first is the partition count when all is well (less: some are between owners)."""

    def __init__(self, ownership: _Share) -> None:
        self.ownership = ownership

    def collect(self) -> Iterable[Metric]:
        labels = [self.ownership.service, self.ownership.member]
        owned = GaugeMetricFamily(
            "rally_partitions_owned",
            "Partitions this replica owns now (and fences, where the service writes).",
            labels=["service", "instance"],
        )
        owned.add_metric(labels, len(self.ownership.owned))
        members = GaugeMetricFamily(
            "rally_partition_members",
            "Live replicas this one sees sharing the partitions.",
            labels=["service", "instance"],
        )
        members.add_metric(labels, len(self.ownership.members))
        return [owned, members]
