"""Alibaba openb (cluster-trace-gpu-v2023) nodes and pods -> canonical cluster and workload.

By default only whole-GPU pods are replayed (``num_gpu >= 1`` and, for one GPU, ``gpu_milli == 1000``), as
the evaluation's openb section always has. With ``shares=True`` a pod asking for a fraction of one GPU becomes
a fractional job (``gpu_milli``) and every job carries its pod's CPU and memory (one pod is one task:
``cpu_milli`` / ``memory_mib`` per task), so the trace replays through the scheduler with GPU sharing
(docs/sharing.md). CPU-only pods are always skipped: a job holds at least part of a GPU. Pods that never ran
(no ``scheduled_time``) have no runtime and are skipped. The runtime is ``deletion_time - scheduled_time``;
``gpu_spec`` ("A|B") becomes the job's allowed GPU types.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from rallypoint.sim.cluster import Cluster, Node
from rallypoint.sim.workload import Job

# openb QoS -> our priority classes: latency-sensitive work is what a user would protect most.
QOS_PRIORITY = {
    "LS": "training-high",
    "Guaranteed": "training-high",
    "Burstable": "training-standard",
    "BE": "best-effort",
}


@dataclass(frozen=True, slots=True)
class SkipCounts:
    fractional: int = 0
    cpu_only: int = 0
    never_ran: int = 0


def read_nodes(path: str | Path, nodes_per_rack: int = 16, gpu_only: bool = True) -> Cluster:
    """Nodes in file order; openb has no rack data, so consecutive nodes form racks of ``nodes_per_rack``."""
    nodes: list[Node] = []
    p = Path(path)
    with p.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                gpus = int(r["gpu"])
                if gpu_only and gpus == 0:
                    continue
                k = len(nodes)
                nodes.append(
                    Node(
                        id=r["sn"].strip(),
                        rack=f"rack-{k // nodes_per_rack:03d}",
                        gpus=gpus,
                        gpu_type=(r.get("model") or "").strip() or "none",
                        cpu=int(r["cpu_milli"]),
                        memory=int(r["memory_mib"]),
                    )
                )
            except (KeyError, ValueError) as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
    return Cluster(nodes=tuple(nodes), name=p.stem)


def read_pods(path: str | Path, shares: bool = False) -> tuple[list[Job], SkipCounts]:
    """The pods as jobs; ``shares``: fractional pods too, and every job's CPU and memory (module doc)."""
    jobs: list[Job] = []
    frac = cpu = never = 0
    p = Path(path)
    with p.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                n = int(r["num_gpu"])
                milli = int(r["gpu_milli"] or 0)
                if n == 0:
                    cpu += 1
                    continue
                fractional = n == 1 and 0 < milli < 1000
                if fractional and not shares:
                    frac += 1
                    continue
                if not r["scheduled_time"].strip():
                    never += 1
                    continue
                created = float(r["creation_time"])
                run = float(r["deletion_time"]) - float(r["scheduled_time"])
                if run <= 0:
                    never += 1
                    continue
                qos = r["qos"].strip()
                jobs.append(
                    Job(
                        id=r["name"].strip(),
                        submit=created,
                        gpus=n,
                        duration=run,
                        team=f"qos-{qos.lower()}",
                        priority=QOS_PRIORITY.get(qos, "training-standard"),
                        gpu_type=r["gpu_spec"].strip() or None,
                        gpu_milli=milli if fractional else None,
                        cpu_milli=int(r["cpu_milli"] or 0) if shares else 0,
                        memory_mib=int(r["memory_mib"] or 0) if shares else 0,
                    )
                )
            except (KeyError, ValueError) as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
    jobs.sort(key=lambda j: j.submit)
    return jobs, SkipCounts(frac, cpu, never)
