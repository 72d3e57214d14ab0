"""`rally bench cluster --replicas ...`: the handover of each partitioned service's partitions when the
replica owning most of them is killed (-9), read from the log: from the kill to the last of its partitions
fenced again by a survivor (``LeaderEpochStarted`` of role ``<service>.<p>``, its store time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from rallypoint.localcluster.supervisor import LocalCluster, instances
from rallypoint.runtime.partitions import member_name

from .logwatch import LogWatch

#: The services whose replicas own partitions fenced by an epoch per partition (``runtime.partitions``).
PARTITIONED_ROLES = ("job-controller", "health-monitor", "checkpoint")


def owners(watch: LogWatch, service: str) -> dict[str, str]:
    """Each of ``service``'s partitions (its role ``<service>.<p>``) -> the member that fenced it last."""
    latest: dict[str, str] = {}
    for _stored, role, leader in watch.partition_epochs:
        if role.rpartition(".")[0] == service:
            latest[role] = leader
    return latest


async def handover(cluster: LocalCluster, watch: LogWatch, service: str, timeout: float) -> dict[str, Any]:
    """Kill the replica of ``service`` that owns most partitions; seconds until a survivor fenced each."""
    by_member = {member_name(name): name for name in instances(service, cluster.replicas.get(service, 1))}
    held = owners(watch, service)
    counts = {m: sum(1 for owner in held.values() if owner == m) for m in by_member}
    victim = max(counts, key=lambda m: (counts[m], m))
    lost = {role for role, owner in held.items() if owner == victim}
    killed_at = time.time()
    await asyncio.to_thread(cluster.kill, by_member[victim])

    def retaken() -> dict[str, float]:
        taken: dict[str, float] = {}
        for stored, role, leader in watch.partition_epochs:
            if role in lost and leader != victim and stored > killed_at:
                taken.setdefault(role, stored)
        return taken

    await watch.wait(lambda: len(retaken()) == len(lost), timeout)
    taken = retaken()
    cluster.restart(by_member[victim])  # back, as the supervisor of `rally up` would bring it
    # ... and answering before the next service's kill: a host (``--colocate``) brings back every service
    # it hosts, and the next victim may be the survivor, whose partitions only the restarted one can take
    await _answering(cluster, by_member[victim], timeout)
    return {
        "killed": by_member[victim],
        "partitions": len(lost),
        "retaken": len(taken),
        "handover_s": round(max(taken.values()) - killed_at, 3)
        if taken and len(taken) == len(lost)
        else None,
    }


async def _answering(cluster: LocalCluster, name: str, timeout: float) -> None:
    """Until ``name``'s /healthz answers 200, or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _ = await asyncio.to_thread(cluster.health, name, "/healthz")
        if status == 200:
            return
        await asyncio.sleep(0.5)


async def handovers(
    cluster: LocalCluster, watch: LogWatch, replicas: Mapping[str, int], timeout: float
) -> dict[str, Any]:
    """One kill per partitioned service that runs two replicas or more."""
    out: dict[str, Any] = {}
    for service in PARTITIONED_ROLES:
        if replicas.get(service, 1) >= 2 and owners(watch, service):
            out[service] = await handover(cluster, watch, service, timeout)
    return {"handovers": out} if out else {}
