"""The canonical cluster format (JSON or YAML).

Either a generator::

    generator: {racks: 44, nodes_per_rack: 8, gpus_per_node: 8, nvlink_domain: 8, gpu_type: V100}

(a list of generators builds a heterogeneous cluster), or an explicit node list::

    nodes:
      - {id: n0, rack: r0, gpus: 8, gpu_type: G2, cpu: 96000, memory: 786432}

or both. An optional ``faults`` block turns on node failures and sets the cost of preemption::

    faults: {node_mtbf: 2592000, repair_time: 7200, checkpoint_overhead: 60}

``node_mtbf`` is the mean time between failures of one node (exponential, seeded by --seed), ``repair_time``
how long a failed node stays out, ``checkpoint_overhead`` the seconds a preempted, failed or resized job pays
to save and restore its state. ``events: [{node, at, down_for}]`` adds scripted failures. ``fail_slow``
turns on fail-slow episodes and, optionally, straggler replacement (``rallypoint.sim.failslow.FailSlow``)::

    faults: {fail_slow: {seed: 1, replace: true, detector: node, model: {mean_gap_s: 345600}}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from rallypoint.configfile import read_structured

from .failslow import FailSlow


class ClusterError(ValueError):
    """A cluster file is malformed."""


class Node(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    rack: str
    gpus: int
    spine: str = "spine-0"
    gpu_type: str = "gpu"
    cpu: int = 0
    memory: int = 0
    nvlink_domain: int | None = None  # GPUs per NVLink domain; None means the whole node
    mig_gpus: tuple[int, ...] = ()  # GPUs in MIG mode (MIG slices only; the type must be MIG-capable)
    labels: dict[str, str] = {}  # what jobs' node_selector match, as an agent's --label
    taints: tuple[str, ...] = ()  # only jobs tolerating all of them run here, as an agent's --taint
    gpu_memory: int = 0  # MiB per GPU (0: unknown), as the agent registers it


class Generator(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    racks: int
    nodes_per_rack: int
    gpus_per_node: int = 8
    nvlink_domain: int | None = None
    gpu_type: str = "gpu"
    cpu: int = 0
    memory: int = 0
    mig_gpus: tuple[int, ...] = ()
    labels: dict[str, str] = {}
    taints: tuple[str, ...] = ()
    prefix: str = ""
    racks_per_spine: int | None = None  # None: every rack under one spine


class FaultEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A scripted failure (what-if: "node X dies at t"); ``down_for`` None uses ``repair_time``."""

    node: str
    at: float
    down_for: float | None = None


class Faults(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    node_mtbf: float | None = None
    repair_time: float = 3600.0
    checkpoint_overhead: float = 0.0
    events: list[FaultEvent] = []
    fail_slow: FailSlow | None = None  # None: no node is ever slow (SimOptions.failslow overrides it)


class ClusterFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    generator: Generator | list[Generator] | None = None
    nodes: list[Node] = []
    faults: Faults = Faults()
    name: str = ""


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    """The expanded cluster the simulator runs on: every node, in a stable order."""

    nodes: tuple[Node, ...]
    faults: Faults = Faults()
    name: str = ""

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_type for n in self.nodes}))


def generate(gen: Generator) -> list[Node]:
    p = gen.prefix
    return [
        Node(
            id=f"{p}r{r:03d}-n{k:02d}",
            rack=f"{p}r{r:03d}",
            spine=f"{p}s{r // gen.racks_per_spine:03d}" if gen.racks_per_spine else "spine-0",
            gpus=gen.gpus_per_node,
            gpu_type=gen.gpu_type,
            cpu=gen.cpu,
            memory=gen.memory,
            nvlink_domain=gen.nvlink_domain,
            mig_gpus=gen.mig_gpus,
            labels=gen.labels,
            taints=gen.taints,
        )
        for r in range(gen.racks)
        for k in range(gen.nodes_per_rack)
    ]


def build_cluster(spec: ClusterFile) -> Cluster:
    gens = spec.generator if isinstance(spec.generator, list) else [spec.generator] if spec.generator else []
    nodes: list[Node] = []
    for g in gens:
        if g.racks < 1 or g.nodes_per_rack < 1 or g.gpus_per_node < 0:
            raise ClusterError("generator: racks and nodes_per_rack must be >= 1, gpus_per_node >= 0")
        nodes.extend(generate(g))
    nodes.extend(spec.nodes)
    if not nodes:
        raise ClusterError("cluster has no nodes (give a generator or a node list)")
    seen: set[str] = set()
    for n in nodes:
        if n.id in seen:
            raise ClusterError(f"duplicate node id {n.id!r}")
        if n.gpus < 0:
            raise ClusterError(f"node {n.id}: gpus must be >= 0")
        seen.add(n.id)
    f = spec.faults
    if f.node_mtbf is not None and f.node_mtbf <= 0:
        raise ClusterError("faults.node_mtbf must be > 0")
    if f.repair_time < 0 or f.checkpoint_overhead < 0:
        raise ClusterError("faults.repair_time and faults.checkpoint_overhead must be >= 0")
    for ev in f.events:
        if ev.node not in seen:
            raise ClusterError(f"faults.events: unknown node {ev.node!r}")
        if ev.at < 0 or (ev.down_for is not None and ev.down_for < 0):
            raise ClusterError("faults.events: at and down_for must be >= 0")
    for ep in f.fail_slow.episodes or () if f.fail_slow else ():
        if ep.node not in seen:
            raise ClusterError(f"faults.fail_slow.episodes: unknown node {ep.node!r}")
        if ep.start < 0 or ep.duration < 0 or ep.factor < 1:
            raise ClusterError("faults.fail_slow.episodes: start and duration must be >= 0, factor >= 1")
    return Cluster(nodes=tuple(nodes), faults=f, name=spec.name)


def cluster_from_obj(obj: Any, source: str = "<cluster>") -> Cluster:
    try:
        spec = msgspec.convert(obj, ClusterFile)
    except msgspec.ValidationError as e:
        raise ClusterError(f"{source}: {e}") from None
    try:
        return build_cluster(spec)
    except ClusterError as e:
        raise ClusterError(f"{source}: {e}") from None


def load_cluster(path: str | Path) -> Cluster:
    try:
        obj = read_structured(path, "cluster")
    except ValueError as e:
        raise ClusterError(str(e)) from None
    return cluster_from_obj(obj, str(path))


def cluster_to_obj(cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": msgspec.to_builtins(list(cluster.nodes))}
    if cluster.name:
        out["name"] = cluster.name
    if cluster.faults != Faults():
        faults = msgspec.to_builtins(cluster.faults)
        if faults.get("fail_slow") is None:
            faults.pop("fail_slow", None)  # files written before fail-slow existed stay as they were
        out["faults"] = faults
    return out


def homogeneous(
    racks: int,
    nodes_per_rack: int,
    gpus_per_node: int = 8,
    gpu_type: str = "gpu",
    faults: Faults | None = None,
) -> Cluster:
    """Shortcut used by converters and tests."""
    spec = ClusterFile(
        generator=Generator(
            racks=racks, nodes_per_rack=nodes_per_rack, gpus_per_node=gpus_per_node, gpu_type=gpu_type
        ),
        faults=faults or Faults(),
    )
    return build_cluster(spec)
