"""Two `rally serve preemption` processes split the evictions by job; after one is killed with SIGKILL the
survivor reports its evictions too (issue 34).

Real nats-server, real processes. The test appends the scheduler's and the job controller's events itself
(a gang per node, started, asked to stop, preempted), so it knows which jobs are evicted when; which
replica owns a job is the rendezvous over the two members (``runtime.partitions.assigned``), the same
answer the services compute. What each replica reports is read from its log.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import nats.errors
import nats.js.errors
import pytest
import test_nats_acl
from nats.js.kv import KeyValue
from rallypoint_services.preemption.loop import PARTITIONS
from test_projector_quarantine import eventually, nats_url

from rallypoint.eventlog import EventLog, NatsCredentials, connect_nats
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    PreemptionRequested,
    TaskPlacement,
    event_type,
    subjects,
)
from rallypoint.infra import ManagedProcess, free_port
from rallypoint.runtime.partitions import PARTITION_BUCKET, WorkShare, assigned
from rallypoint.security import ADMIN

T0 = 1_760_000_000.0
MEMBERS = ("pre-a", "pre-b")
FIRST = [f"v{i:02d}" for i in range(6)]  # evicted while both replicas run
SECOND = [f"v{i:02d}" for i in range(6, 12)]  # evicted right after pre-a is killed
DEADLINE_S = 30.0


class Replica:
    """`rally serve preemption` with its own instance name, log file and health port."""

    def __init__(self, log: EventLog, workdir: Path, instance: str) -> None:
        self.instance = instance
        self.port = free_port()
        argv = [sys.executable, "-m", "rallypoint.cli.main", "serve", "preemption", "--instance", instance]
        argv += ["--nats-url", nats_url(log), "--health-port", str(self.port), "--log-format", "text"]
        argv += ["--partition-ttl", "1"]
        self.log_path = workdir / f"{instance}.log"
        self.proc = ManagedProcess(argv, log_path=self.log_path)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def began(self, job_id: str) -> bool:
        """It reported the eviction's start, or took it over while open."""
        return bool(re.search(rf"(eviction of|watching eviction of) {job_id} [(f]", self.text()))

    def ended(self, job_id: str) -> bool:
        return f"eviction of {job_id} ended" in self.text()

    async def gauge(self, name: str) -> float | None:
        assert self.proc.running(), self.proc.log_tail()
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"http://127.0.0.1:{self.port}/metrics", timeout=aiohttp.ClientTimeout(total=5)
                ) as resp,
            ):
                text = await resp.text()
        except aiohttp.ClientError:
            return None  # not listening yet
        label = f'{name}{{instance="{self.instance}",service="preemption"}} '
        line = next((line for line in text.splitlines() if line.startswith(label)), None)
        return None if line is None else float(line.split()[-1])


def owner(job_id: str, members: tuple[str, ...] = MEMBERS) -> str:
    partition = subjects.partition_of(job_id, PARTITIONS)
    return next(m for m in members if partition in assigned(m, members, PARTITIONS))


class Log:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.count = 0

    async def put(self, subject: str, event: Event) -> None:
        self.count += 1
        await self.log.append(subject, event, msg_id=f"test:{self.count}:{event_type(event)}", source="test")


async def running_gangs(w: Log, jobs: list[str]) -> None:
    """One 8-GPU gang per node, bound and started."""
    await w.put(subjects.EPOCH, LeaderEpochStarted(epoch=1, leader_id="sched-0", at=T0))
    for k, job_id in enumerate(jobs):
        node_id = f"n{k:02d}"
        gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
        await w.put(
            subjects.node_registration(node_id),
            NodeRegistered(
                node_id=node_id, address="127.0.0.1", rack="r1", gpu_type="sim", gpus=gpus, cpu_milli=1000,
                memory_mib=1000, agent_instance="a", at=T0,
            ),
        )  # fmt: skip
        spec = JobSpec(
            name=job_id,
            team="t",
            gpus=8,
            gpus_per_task=8,
            ranks_per_task=1,
            command=("true",),
            priority="best-effort",
        )
        await w.put(subjects.job(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=T0 + 1))
        placement = TaskPlacement(task=0, node_id=node_id, gpus=tuple(range(8)))
        await w.put(
            subjects.bind(job_id),
            GangBound(
                job_id=job_id, attempt=1, epoch=1, placements=(placement,), computed_at_seq=0,
                policy_version="test", now=T0 + 2, at=T0 + 2,
            ),
        )  # fmt: skip
        await w.put(subjects.job_control(job_id), JobStarted(job_id=job_id, attempt=1, at=T0 + 3))


async def request(w: Log, job_id: str) -> None:
    await w.put(
        subjects.preempt(job_id),
        PreemptionRequested(
            job_id=job_id, role="scheduler", attempt=1, for_job="urgent", reason="priority", epoch=1,
            computed_at_seq=0, policy_version="test", now=T0 + 10, at=T0 + 10,
        ),
    )  # fmt: skip


async def preempted(w: Log, job_id: str) -> None:
    await w.put(
        subjects.job_control(job_id),
        JobPreempted(job_id=job_id, attempt=1, for_job="urgent", reason="priority", at=T0 + 20),
    )


def sees(replicas: list[Replica], members: float, owned: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for r in replicas:
            if await r.gauge("rally_partition_members") != members:
                return False
        counts = [await r.gauge("rally_partitions_owned") for r in replicas]
        return sum(c or 0 for c in counts) == owned

    return check


async def test_replicas_split_the_evictions_and_a_killed_ones_are_reported_by_the_survivor(
    event_log: EventLog, tmp_path: Path
) -> None:
    # The split this test relies on, computed as the services compute it: each replica owns some of each
    # batch, so both the killed one's open evictions and its ended ones must move to the survivor.
    assert {owner(j) for j in FIRST} == set(MEMBERS) and "pre-a" in {owner(j) for j in SECOND}
    w = Log(event_log)
    await running_gangs(w, FIRST + SECOND)
    replicas = {name: Replica(event_log, tmp_path, name) for name in MEMBERS}
    killed, survivor = replicas["pre-a"], replicas["pre-b"]
    try:
        await eventually(sees(list(replicas.values()), 2, PARTITIONS), "two members sharing 32", DEADLINE_S)

        # Both run: each eviction is reported by its job's owner alone.
        for job_id in FIRST:
            await request(w, job_id)
        for job_id in FIRST:
            await eventually(
                lambda j=job_id: _true(replicas[owner(j)].began(j)), f"{job_id} reported", DEADLINE_S
            )
        for job_id in FIRST:
            other = next(r for name, r in replicas.items() if name != owner(job_id))
            assert not other.began(job_id), (job_id, other.instance)

        # kill -9 one: the evictions it watched end, new ones begin, before the survivor's share grows.
        os.kill(killed.proc.pid, signal.SIGKILL)
        for job_id in FIRST:
            await preempted(w, job_id)
        for job_id in SECOND:
            await request(w, job_id)
        written = await event_log.last_seq()

        await eventually(sees([survivor], 1, PARTITIONS), "the survivor owns all 32", DEADLINE_S)
        for job_id in FIRST:
            await eventually(
                lambda j=job_id: _true(survivor.ended(j)), f"{job_id}'s end reported", DEADLINE_S
            )
        for job_id in SECOND:
            await eventually(lambda j=job_id: _true(survivor.began(j)), f"{job_id} watched", DEADLINE_S)
        assert "(taken over" in survivor.text()
        assert await event_log.last_seq() == written  # the watchers wrote nothing
        assert survivor.proc.stop(timeout=30) == 0, survivor.proc.log_tail()
    finally:
        for replica in replicas.values():
            replica.proc.stop(timeout=30)


async def _true(value: bool) -> bool:
    return value


# The preemption service's own NATS user (the permission matrix, on a live server): it may keep its
# presence among its replicas, and write no other service's keys. Both configs, as in test_nats_acl.
secured = test_nats_acl.secured


async def test_the_preemption_user_keeps_its_presence_and_no_other_services(
    secured: test_nats_acl.Secured,
) -> None:
    credentials = NatsCredentials("preemption", secured.credentials.passwords["preemption"])
    nc = await connect_nats(secured.server.url, name="acl-preemption", credentials=credentials)
    try:
        js = nc.jetstream()
        share = await WorkShare.open(js, service="preemption", member="pre-a", count=PARTITIONS)
        await share.step()
        assert share.owned == frozenset(range(PARTITIONS)) and share.members == ("pre-a",)
        await share.resign()
        posing = await WorkShare.open(js, service="job-controller", member="pre-a", count=PARTITIONS)
        with pytest.raises((nats.errors.TimeoutError, TimeoutError, nats.js.errors.APIError)):
            await posing.step()
    finally:
        await nc.close()
    admin = await secured.connect(ADMIN)
    try:
        kv = await admin.jetstream().key_value(PARTITION_BUCKET)
        assert [k async for k in _keys(kv)] == []  # its own presence deleted, the refused one never there
    finally:
        await admin.close()


async def _keys(kv: KeyValue) -> AsyncIterator[str]:
    with contextlib.suppress(nats.js.errors.NoKeysError):
        for key in await kv.keys():
            yield key
