"""What the tests of a partitioned service's replicas share (``runtime.partitions``): a fresh partitions
bucket, a replica killed as kill -9 would kill it or paused as SIGSTOP would, and whether the live replicas
own what the assignment gives them. ``Replica`` is the part of one replica every such test has: its fold,
its share of the partitions and its service loop, started and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

from nats.js.kv import KeyValue

from rallypoint.eventlog import EventLog
from rallypoint.eventlog.setup import open_partition_bucket
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import PARTITION_BUCKET, PartitionOwnership, assigned

#: A short partition TTL: a killed replica's partitions are taken within about a second.
TTL = 1.0


@contextlib.asynccontextmanager
async def fresh_bucket(log: EventLog, ttl: float = TTL) -> AsyncIterator[KeyValue]:
    """KV ``rally-partitions`` made anew with ``ttl`` (an earlier test's keys would read as live replicas,
    and a bucket's TTL is fixed when it is made), deleted afterwards."""
    with contextlib.suppress(Exception):  # none left by an earlier test
        await log.js.delete_key_value(PARTITION_BUCKET)
    kv = await open_partition_bucket(log.js, ttl=ttl)
    try:
        yield kv
    finally:
        with contextlib.suppress(Exception):
            await log.js.delete_key_value(PARTITION_BUCKET)


async def kill(partitions: PartitionOwnership, tasks: Sequence[asyncio.Task[None]]) -> None:
    """As kill -9: everything stops at once; presence and leases stay until they expire."""
    partitions.abandon()
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5.0)


def pause(partitions: PartitionOwnership, tasks: Iterable[asyncio.Task[None]]) -> None:
    """As SIGSTOP or a long GC: no more rounds, renewals or work (``tasks``: its claim loop and service
    loop), but it still believes it owns its partitions and keeps their writers."""
    for task in tasks:
        task.cancel()
    for lease in partitions.leases.values():
        lease.abandon()


def settled(owners: Mapping[str, PartitionOwnership], live: Iterable[str]) -> bool:
    """Every replica in ``live`` owns (and fences) exactly what the assignment gives it among them."""
    members = list(live)
    return all(set(owners[n].writers) == assigned(n, members, owners[n].count) for n in members)


class Losses:
    """The partitions a replica owned and dropped while alive (a lease it could not renew in time, as on a
    loaded test machine), as its ownership's listeners tell it; ``dead`` once it is killed, after which
    its drops are its death, not losses."""

    def __init__(self, partitions: PartitionOwnership) -> None:
        self.partitions = partitions
        self.dead = False
        self.lost: set[int] = set()
        self._held: frozenset[int] = frozenset()
        partitions.listeners.append(self._changed)

    def _changed(self) -> None:
        held = frozenset(self.partitions.writers)
        if not self.dead:
            self.lost |= self._held - held
        self._held = held


def lost_by_any(losses: Iterable[Losses]) -> set[int]:
    """Every partition some replica lost while alive."""
    return {partition for loss in losses for partition in loss.lost}


class Replica:
    """A replica's fold, share of the partitions and service loop (``work``, given by the service's test)."""

    follower: Follower
    partitions: PartitionOwnership

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def work(self, stop: asyncio.Event) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        await self.follower.catch_up()
        self.tasks = [
            asyncio.create_task(self.follower.run()),
            self.partitions.start(self.stop),
            asyncio.create_task(self.work(self.stop)),
        ]

    async def kill(self) -> None:
        await kill(self.partitions, self.tasks)

    def pause(self) -> None:
        pause(self.partitions, self.tasks[1:])
