"""The health monitor's decisions: heartbeats and GPU samples in, the few node events that matter out.

Pure: the shell passes the folded node views, the last heartbeat seen per node and ``now``. Heartbeats
themselves never enter the log (2,500/s of samples would drown it); only state changes do.
"""

from __future__ import annotations

import msgspec

from rallypoint.events import Event, NodeDrained, NodeHeartbeatLost, NodeLost, NodeRecovered
from rallypoint.protocol import Heartbeat
from rallypoint.state import NodeView

# XIDs that mean the GPU or its memory is no longer trustworthy (NVIDIA's "reset or replace" class).
FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95})


class HealthPolicy(msgspec.Struct, frozen=True, kw_only=True):
    unreachable_after_s: float = 5.0
    lost_after_s: float = 30.0
    max_temperature_c: float = 90.0


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    event: Event
    msg_id: str


def _gpu_fault(beat: Heartbeat, policy: HealthPolicy) -> str | None:
    for gpu in sorted(beat.gpus, key=lambda g: g.index):
        if gpu.ecc_uncorrectable > 0:
            return f"GPU {gpu.index}: {gpu.ecc_uncorrectable} uncorrectable ECC errors"
        if gpu.xid in FATAL_XIDS:
            return f"GPU {gpu.index}: XID {gpu.xid}"
        if gpu.temperature_c > policy.max_temperature_c:
            return f"GPU {gpu.index}: {gpu.temperature_c:.0f} C exceeds {policy.max_temperature_c:.0f} C"
    return None


def assess(
    nodes: list[NodeView],
    last_beats: dict[str, Heartbeat],
    last_seen: dict[str, float],
    now: float,
    policy: HealthPolicy,
    *,
    watching_since: float,
) -> list[Decision]:
    """Events to append now. ``last_seen`` is when this monitor last heard each node (its own clock);
    ``watching_since`` is when it started listening, so a freshly restarted monitor gives every node a
    full timeout before calling it silent."""
    out: list[Decision] = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        seen = last_seen.get(node.node_id, max(node.registered_at, watching_since))
        silent = now - seen
        incarnation = f"{node.node_id}:{node.agent_instance}"
        if node.status == "up" and silent > policy.unreachable_after_s:
            out.append(
                Decision(
                    node_id=node.node_id,
                    event=NodeHeartbeatLost(node_id=node.node_id, last_seen=seen, at=now),
                    msg_id=f"{incarnation}:NodeHeartbeatLost:{seen:.0f}",
                )
            )
        elif node.status == "unreachable" and silent > policy.lost_after_s:
            out.append(
                Decision(
                    node_id=node.node_id,
                    event=NodeLost(node_id=node.node_id, at=now, reason=f"no heartbeat for {silent:.0f} s"),
                    msg_id=f"{incarnation}:NodeLost:{seen:.0f}",
                )
            )
        elif node.status in ("unreachable", "lost") and silent <= policy.unreachable_after_s:
            # A lost node whose agent answers again returns to service by itself; the job controller
            # kills whatever ranks it still runs for attempts that moved on.
            out.append(
                Decision(
                    node_id=node.node_id,
                    event=NodeRecovered(node_id=node.node_id, at=now),
                    msg_id=f"{incarnation}:NodeRecovered:{seen:.0f}",
                )
            )
        beat = last_beats.get(node.node_id)
        if node.status == "up" and beat is not None:
            fault = _gpu_fault(beat, policy)
            if fault is not None:
                out.append(
                    Decision(
                        node_id=node.node_id,
                        event=NodeDrained(node_id=node.node_id, reason=fault, at=now),
                        msg_id=f"{incarnation}:NodeDrained:{fault}",
                    )
                )
    return out
