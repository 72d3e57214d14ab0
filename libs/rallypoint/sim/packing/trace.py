"""openb nodes and pods for the packing simulator, fractional-GPU pods included.

A pod asks for ``cpu_milli``, ``memory_mib`` and ``num_gpu`` GPUs of ``gpu_milli`` thousandths each: a shared
pod has ``num_gpu == 1`` and ``gpu_milli < 1000``; a whole-GPU pod ``gpu_milli == 1000`` (an empty
``gpu_milli`` on a GPU pod means whole GPUs); a CPU pod ``num_gpu == 0``. ``gpu_spec`` lists the GPU models
the pod accepts, '|'-separated, empty for any.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

MILLI = 1000


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu: int
    memory: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    cpu: int
    memory: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def models(self) -> tuple[str, ...]:
        return tuple(m for m in self.gpu_spec.split("|") if m)


def _int(row: dict[str, str], key: str) -> int:
    value = (row.get(key) or "").strip()
    if key not in row:
        raise ValueError(f"missing column {key!r}")
    return int(float(value)) if value else 0


def read_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes in file order; CPU-only nodes (``gpu == 0``) are kept (they can host CPU pods)."""
    p = Path(path)
    nodes: list[NodeSpec] = []
    with p.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                spec = NodeSpec(
                    name=(r.get("sn") or "").strip() or f"node-{i}",
                    cpu=_int(r, "cpu_milli"),
                    memory=_int(r, "memory_mib"),
                    gpus=_int(r, "gpu"),
                    model=(r.get("model") or "").strip(),
                )
            except ValueError as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
            if spec.gpus < 0 or spec.gpus > 8 or spec.cpu < 0 or spec.memory < 0:
                raise ValueError(f"{p}:{i + 2}: node needs 0..8 GPUs and non-negative cpu/memory")
            nodes.append(spec)
    if not nodes:
        raise ValueError(f"{p}: no nodes")
    return nodes


def read_pods(path: str | Path) -> list[PodSpec]:
    """Every pod of the file in file order (the protocol shuffles them)."""
    p = Path(path)
    pods: list[PodSpec] = []
    with p.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                num = _int(r, "num_gpu")
                milli = _int(r, "gpu_milli") if num else 0
                if num and not milli:
                    milli = MILLI
                pod = PodSpec(
                    name=(r.get("name") or "").strip() or f"pod-{i}",
                    cpu=_int(r, "cpu_milli"),
                    memory=_int(r, "memory_mib"),
                    num_gpu=num,
                    gpu_milli=milli,
                    gpu_spec=(r.get("gpu_spec") or "").strip(),
                )
            except ValueError as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
            if not 0 <= num <= 8 or not 0 <= milli <= MILLI or (num > 1 and milli != MILLI):
                raise ValueError(f"{p}:{i + 2}: num_gpu 0..8, gpu_milli 0..1000, several GPUs only whole")
            pods.append(pod)
    if not pods:
        raise ValueError(f"{p}: no pods")
    return pods
