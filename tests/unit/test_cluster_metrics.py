"""Given a folded log, the cluster gauges say what it holds: GPUs by rack/type/state, fragmentation, the
queue, team usage and goodput, checkpoint save times (``rallypoint.observability.cluster``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rallypoint.core.types import Queue, Quota
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeDrained,
    NodeHealthChanged,
    NodeRegistered,
    RankExited,
    TaskPlacement,
)
from rallypoint.observability import ClusterCollector, fragmented_gpus
from rallypoint.state import ClusterState


def node(node_id: str, rack: str, gpu_type: str = "H100", gpus: int = 8) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack=rack,
        gpu_type=gpu_type,
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(gpus)
        ),
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def submit(job_id: str, gpus: int, per_task: int, team: str = "nlp", **spec: Any) -> JobSubmitted:
    fields: dict[str, Any] = {"name": job_id, "team": team, "ranks_per_task": 1, "command": ("true",)}
    return JobSubmitted(
        job_id=job_id, spec=JobSpec(gpus=gpus, gpus_per_task=per_task, **(fields | spec)), submitted_at=2.0
    )


def bind(job_id: str, node_id: str, gpus: tuple[int, ...]) -> GangBound:
    return GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=(TaskPlacement(task=0, node_id=node_id, gpus=gpus),),
        computed_at_seq=0,
        policy_version="test",
        now=3.0,
        at=3.0,
    )


def fold(*events: Event) -> ClusterState:
    state = ClusterState()
    for seq, event in enumerate(events, start=1):
        state.apply(seq, event)
    return state


def samples(
    state: ClusterState, now: float = 100.0, queues: tuple[Queue, ...] = ()
) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: state, queues, clock=lambda: now))
    text = generate_latest(registry).decode()
    return {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


CLUSTER = (
    LeaderEpochStarted(epoch=1, leader_id="s1", role="scheduler", at=1.0),
    node("n1", "r1"),
    node("n2", "r1"),
    node("n3", "r2", gpu_type="A100"),
    submit("big", 6, 6),
    bind("big", "n1", (0, 1, 2, 3, 4, 5)),
    JobStarted(job_id="big", attempt=1, at=10.0),
)


def test_gpus_by_rack_type_and_state_with_a_drained_node_unhealthy() -> None:
    state = fold(*CLUSTER, NodeDrained(node_id="n2", reason="xid 79", at=5.0))
    got = samples(state)
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=allocated")] == 6
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=free")] == 2
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=unhealthy")] == 8
    assert got[("rally_gpus", "gpu_type=A100,rack=r2,state=free")] == 8
    assert got[("rally_team_gpus_allocated", "team=nlp")] == 6


def test_every_node_status_health_and_gpu_state_has_a_series_at_zero_too() -> None:
    # No node is lost, unreachable, suspect or failed: each still has its series, at 0, on every rack, so
    # an alert on `rally_nodes{status="lost"} > 0` sees a value, not an absent series.
    got = samples(fold(*CLUSTER, NodeDrained(node_id="n2", reason="xid 79", at=5.0)))
    for rack in ("r1", "r2"):
        for status in ("up", "unreachable", "drained", "lost"):
            assert (("rally_nodes", f"rack={rack},status={status}")) in got, (rack, status)
        for health in ("healthy", "suspect", "degraded", "failed"):
            assert ("rally_nodes_by_health", f"health={health},rack={rack}") in got, (rack, health)
    assert (
        got[("rally_nodes", "rack=r1,status=up")] == 1 and got[("rally_nodes", "rack=r1,status=drained")] == 1
    )
    assert got[("rally_nodes", "rack=r2,status=lost")] == 0 and got[("rally_nodes", "rack=r2,status=up")] == 1
    assert got[("rally_nodes_by_health", "health=failed,rack=r1")] == 0
    assert got[("rally_gpus", "gpu_type=A100,rack=r2,state=unhealthy")] == 0


def test_a_cordoned_nodes_idle_gpus_are_unhealthy_and_nodes_are_counted_by_health() -> None:
    # n1 runs "big" on 6 GPUs and is degraded: its 6 stay allocated, its 2 idle ones take no work
    degraded = NodeHealthChanged(node_id="n1", state="degraded", previous="healthy", at=20.0)
    got = samples(fold(*CLUSTER, degraded))
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=allocated")] == 6
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=unhealthy")] == 2
    assert got[("rally_gpus", "gpu_type=H100,rack=r1,state=free")] == 8
    assert got[("rally_nodes_by_health", "health=degraded,rack=r1")] == 1
    assert got[("rally_nodes_by_health", "health=healthy,rack=r1")] == 1
    assert got[("rally_nodes_by_health", "health=healthy,rack=r2")] == 1


def test_fragmented_gpus_are_free_gpus_where_no_pending_task_fits() -> None:
    assert fragmented_gpus(fold(*CLUSTER)) == {}, "nothing pending, nothing stranded"
    # a pending 4-GPU task of any type: n1's 2 free GPUs are stranded, n2's and n3's 8 are not
    state = fold(*CLUSTER, submit("wide", 4, 4))
    assert fragmented_gpus(state) == {"H100": 2, "A100": 0}
    # a pending H100-only job of 8-GPU tasks cannot use the A100 node, nor n1's 2: n1 is still stranded
    state = fold(*CLUSTER, submit("h100", 8, 8, gpu_type="H100"))
    assert fragmented_gpus(state) == {"H100": 2, "A100": 8}


def test_queue_usage_goodput_and_quota() -> None:
    preempted = JobPreempted(
        job_id="big", attempt=1, for_job="x", reason="priority", lost_gpu_s=60.0, at=30.0
    )
    state = fold(*CLUSTER, preempted, submit("wide", 4, 4, team="vision"))
    quota = (Queue(name="nlp", quotas=(Quota(nominal=8),)),)
    got = samples(state, now=100.0, queues=quota)
    assert got[("rally_pending_workloads", "reason=Queued,team=nlp")] == 1
    assert got[("rally_pending_workloads", "reason=Queued,team=vision")] == 1
    assert got[("rally_team_allocated_gpu_seconds_total", "team=nlp")] == 6 * 20.0  # ran 10 s -> 30 s
    assert got[("rally_lost_gpu_seconds_total", "team=nlp")] == 60.0
    assert got[("rally_team_goodput_ratio", "team=nlp")] == 0.5
    assert got[("rally_job_preemptions_total", "reason=unknown,team=nlp")] == 1
    assert got[("rally_team_nominal_quota_gpus", "gpu_type=*,team=nlp")] == 8


def test_refused_facts_are_counted_by_kind_with_zeros() -> None:
    assert {k: v for k, v in samples(fold(*CLUSTER)).items() if k[0] == "rally_refused_facts"} == {
        ("rally_refused_facts", "kind=foreign_rank_exit"): 0,
        ("rally_refused_facts", "kind=misplaced"): 0,
        ("rally_refused_facts", "kind=held_registration"): 0,
    }
    # "big" runs its one rank on n1: n2 reporting it is a node speaking for a rank it does not run
    forged = RankExited(job_id="big", attempt=1, rank=0, node_id="n2", exit_code=1, at=11.0)
    moved = node("n3", "r9", gpu_type="A100")
    got = samples(fold(*CLUSTER, forged, moved))
    assert got[("rally_refused_facts", "kind=foreign_rank_exit")] == 1
    assert got[("rally_refused_facts", "kind=held_registration")] == 1
