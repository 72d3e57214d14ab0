"""The inventory read model: nodes, their topology and free/used GPUs, from the shared fold. Pure."""

from __future__ import annotations

import msgspec

from rallypoint.state import ClusterState


class GpuRow(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    nvlink_domain: int
    job_id: str | None


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    rack: str
    spine: str
    gpu_type: str
    status: str
    status_reason: str
    gpus_total: int
    gpus_free: int
    gpus: tuple[GpuRow, ...]


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    nodes: tuple[NodeRow, ...]
    gpus_total: int
    gpus_free: int


def inventory_view(state: ClusterState) -> Inventory:
    rows = []
    for node_id in sorted(state.nodes):
        node = state.nodes[node_id]
        gpus = tuple(
            GpuRow(
                index=g.index, uuid=g.uuid, nvlink_domain=g.nvlink_domain, job_id=node.allocated.get(g.index)
            )
            for g in node.gpus
        )
        free = len(node.gpus) - len(node.allocated) if node.schedulable else 0
        rows.append(
            NodeRow(
                node_id=node_id,
                rack=node.rack,
                spine=node.spine,
                gpu_type=node.gpu_type,
                status=node.status,
                status_reason=node.status_reason,
                gpus_total=len(node.gpus),
                gpus_free=free,
                gpus=gpus,
            )
        )
    return Inventory(
        seq=state.last_seq, nodes=tuple(rows), gpus_total=state.total_gpus(), gpus_free=state.free_gpus()
    )
