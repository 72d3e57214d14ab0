"""Test builders: clusters, running and pending jobs described as small data."""

from __future__ import annotations

from typing import Any

import msgspec

from rallypoint.core import (
    ClusterModel,
    Decisions,
    Node,
    PendingJob,
    RunningJob,
    Snapshot,
    TaskPlacement,
    policy_by_name,
    schedule,
)


def nodes(
    racks: int = 1,
    per_rack: int = 2,
    gpus: int = 8,
    spines: int = 1,
    gpu_type: str = "h100",
    nvlink: tuple[tuple[int, ...], ...] = (),
    prefix: str = "",
) -> list[Node]:
    """Nodes named ``<prefix>s<i>r<j>n<k>`` in ``spines`` x ``racks`` x ``per_rack``."""
    out = []
    for s in range(spines):
        for r in range(racks):
            for k in range(per_rack):
                out.append(
                    Node(
                        id=f"{prefix}s{s}r{r}n{k}",
                        rack=f"{prefix}s{s}r{r}",
                        spine=f"{prefix}s{s}",
                        gpu_type=gpu_type,
                        gpus=gpus,
                        nvlink_domains=nvlink,
                        cpu_milli=64000,
                        memory_mib=1 << 20,
                    )
                )
    return out


def running(
    id: str, on: dict[str, tuple[int, ...]] | list[tuple[str, tuple[int, ...]]], **kw: Any
) -> RunningJob:
    """A running job from {node: gpus} (one task per entry)."""
    items = list(on.items()) if isinstance(on, dict) else list(on)
    pl = tuple(TaskPlacement(task=i, node_id=n, gpus=tuple(g)) for i, (n, g) in enumerate(items))
    kw.setdefault("team", "t")
    kw.setdefault("start_time", 0.0)
    return RunningJob(id=id, gpus=sum(len(g) for _n, g in items), placements=pl, **kw)


def pending(id: str, gpus: int, gpt: int | None = None, submit: float = 0.0, **kw: Any) -> PendingJob:
    kw.setdefault("team", "t")
    return PendingJob(
        id=id, gpus=gpus, gpus_per_task=gpt if gpt is not None else min(gpus, 8), submit_time=submit, **kw
    )


def cluster(ns: list[Node], jobs: list[RunningJob] = (), unhealthy: tuple[str, ...] = ()) -> ClusterModel:  # type: ignore[assignment]
    c = ClusterModel(ns)
    for j in jobs:
        c.bind(j)
    for n in unhealthy:
        c.set_schedulable(n, False)
    return c


ALL = tuple(range(8))


def cycle_both_orders(
    model: ClusterModel, jobs: list[PendingJob], policy: str, now: float = 100.0
) -> Decisions:
    """One cycle of ``policy`` over ``jobs``, which must decide byte for byte the same with the pending list
    reversed (the core's determinism)."""
    decisions = schedule(Snapshot(now=now, cluster=model, pending=tuple(jobs)), policy_by_name(policy))
    again = schedule(Snapshot(now=now, cluster=model, pending=tuple(reversed(jobs))), policy_by_name(policy))
    assert msgspec.json.encode(decisions) == msgspec.json.encode(again)
    return decisions
