"""Three health monitors share the nodes' partitions on a real NATS; one is killed.

In this process, as in ``test_controller_partitions``: twelve registered nodes beat on ``hb.<node>``, three
monitors (each with its own fold of the nodes' subjects and its own share of the partitions) judge them.
A node that falls silent is declared lost once, by its partition's owner; one monitor is killed as kill -9
would (leases and presence abandoned); its partitions are owned by the others within seconds, a node of
its that then falls silent is still declared lost (once, by a survivor), the killed monitor writes nothing
after its death, and its stale writer's append is refused by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import msgspec
import pytest
from rallypoint_services.health_monitor.monitor import HealthMonitor
from test_poison import register_node
from test_trace_chain import until

from rallypoint.eventlog import AppendConflict, EventLog
from rallypoint.eventlog.setup import open_partition_bucket
from rallypoint.events import NodeHeartbeatLost, NodeLost, subjects
from rallypoint.health import HealthPolicy
from rallypoint.health.detection import DetectionPolicy
from rallypoint.health.judge import HealthJudge
from rallypoint.protocol import Heartbeat
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import PARTITION_BUCKET, PartitionOwnership, assigned

TTL = 1.0
COUNT = subjects.HEALTH_PARTITIONS
NAMES = ("a", "b", "c")
NODES = tuple(f"hn{i}" for i in range(12))
POLICY = HealthPolicy(unreachable_after_s=1.0, lost_after_s=2.0)


class Replica:
    """One health monitor with its fold of the nodes' subjects and its share of the partitions."""

    def __init__(self, log: EventLog, kv: object, name: str) -> None:
        self.follower = Follower(log, subjects=subjects.NODES)
        self.partitions = PartitionOwnership(
            kv,  # type: ignore[arg-type]
            log,
            self.follower,
            service=subjects.HEALTH_ROLE,
            member=name,
            count=COUNT,
            ttl=TTL,
            source=f"test/{name}",
        )
        judge = HealthJudge(DetectionPolicy())
        self.monitor = HealthMonitor(
            log.nc, self.follower, POLICY, judge, partitions=self.partitions, tick_s=0.2
        )
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.follower.catch_up()
        loops = (self.follower.run(), self.monitor.run(self.stop))
        self.tasks = [self.partitions.start(self.stop), *(asyncio.create_task(loop) for loop in loops)]

    async def kill(self) -> None:
        """As kill -9: everything stops at once; presence and leases stay until they expire."""
        self.partitions.abandon()
        await asyncio.wait([*map(_cancel, self.tasks)], timeout=5.0)


def _cancel(task: asyncio.Task[None]) -> asyncio.Task[None]:
    task.cancel()
    return task


@contextlib.asynccontextmanager
async def _beating(log: EventLog, silent: set[str]) -> AsyncIterator[None]:
    """Every node not in ``silent`` beats every 0.2 s (``silent`` may grow meanwhile)."""

    async def beat() -> None:
        while True:
            for node_id in NODES:
                if node_id not in silent:
                    hb = Heartbeat(node_id=node_id, agent_instance="test", at=time.time())
                    await log.nc.publish(subjects.heartbeat(node_id), msgspec.json.encode(hb))
            await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _settled(replicas: dict[str, Replica], live: list[str]) -> bool:
    return all(set(replicas[n].partitions.writers) == assigned(n, live, COUNT) for n in live)


def _node_of(member: str, live: list[str], taken: set[str]) -> str:
    """A node (not in ``taken``) whose partition ``member`` owns when ``live`` are the replicas."""
    mine = assigned(member, live, COUNT)
    return next(n for n in NODES if n not in taken and subjects.partition_of(n, COUNT) in mine)


async def test_three_monitors_share_the_nodes_and_survive_one_killed(event_log: EventLog) -> None:
    for node_id in NODES:
        await register_node(event_log, node_id)
    with contextlib.suppress(Exception):
        await event_log.js.delete_key_value(PARTITION_BUCKET)
    kv = await open_partition_bucket(event_log.js, ttl=TTL)
    replicas = {name: Replica(event_log, kv, name) for name in NAMES}
    silent: set[str] = set()
    fold = Follower(event_log, subjects=subjects.NODES)
    await fold.catch_up()
    fold_task = asyncio.create_task(fold.run())

    def lost(node_id: str) -> bool:
        return fold.state.nodes[node_id].status == "lost"

    try:
        async with _beating(event_log, silent):
            for replica in replicas.values():
                await replica.start()
            await until(lambda: _settled(replicas, list(NAMES)), "three monitors split the partitions", 15.0)
            # a node of a's falls silent while all three run: declared lost by a alone
            first = _node_of("a", list(NAMES), set())
            silent.add(first)
            await until(lambda: lost(first), f"{first} declared lost", 20.0)

            killed = replicas["c"]
            victim = _node_of("c", list(NAMES), silent)
            partition = subjects.partition_of(victim, COUNT)
            stale = killed.partitions.writers[partition]
            await killed.kill()
            # its death: what it had already sent on the shared connection is stored before this answer
            killed_from = await event_log.last_seq()
            # liveness only: handover speed is `rally bench partitions`' figure, not a test's
            await until(lambda: _settled(replicas, ["a", "b"]), "c's partitions to be taken", 30.0)
            # one of c's nodes falls silent after its death: still declared lost, by a survivor
            silent.add(victim)
            await until(lambda: lost(victim), f"{victim} declared lost after c's death", 20.0)

            # c's writer from before its death: refused by the server (the new owner's epoch is stored)
            refused = NodeLost(node_id=NODES[-1], reason="a deposed owner's verdict", at=time.time())
            with pytest.raises(AppendConflict):
                await stale.append(subjects.for_event(refused), refused, "deposed:NodeLost")
            assert not lost(NODES[-1])
    finally:
        for replica in replicas.values():
            await replica.kill()
        fold_task.cancel()
        with contextlib.suppress(Exception):
            await event_log.js.delete_key_value(PARTITION_BUCKET)

    records = [r async for r in event_log.replay(subjects=subjects.NODES)]
    verdicts = [r for r in records if isinstance(r.event, NodeLost | NodeHeartbeatLost)]
    by_kind = Counter((type(r.event).__name__, r.event.node_id) for r in verdicts)
    assert by_kind == Counter(
        {("NodeHeartbeatLost", first): 1, ("NodeLost", first): 1}
        | {("NodeHeartbeatLost", victim): 1, ("NodeLost", victim): 1}
    ), by_kind
    owners = {r.event.node_id: r.envelope.get("source") for r in verdicts}
    assert owners[first] == "test/a", owners
    assert owners[victim] in ("test/a", "test/b"), owners
    late = [r for r in records if r.seq > killed_from and r.envelope.get("source") == "test/c"]
    assert late == [], late  # the killed monitor wrote nothing after its death
