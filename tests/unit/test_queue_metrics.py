"""The scheduler's /metrics show each team's nominal and borrowed GPUs and each org's limit and usage, for
the queue file the scheduler runs with (``rallypoint.observability.cluster``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.observability import ClusterCollector
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import queues_from_obj
from rallypoint.state import ClusterState

QUEUES = {
    "cohorts": [{"name": "lab"}],
    "orgs": [{"name": "research", "limit": 12}, {"name": "language", "parent": "research"}],
    "teams": [
        {"name": "nlp", "parent": "language", "cohort": "lab", "nominal": 2},
        {"name": "vision", "parent": "research", "cohort": "lab", "nominal": 4},
        {"name": "infra", "cohort": "lab", "nominal": 2},
    ],
}


def node(node_id: str) -> NodeRegistered:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="r0",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def running(job_id: str, team: str, node_id: str, gpus: tuple[int, ...]) -> list[Event]:
    spec = JobSpec(
        name=job_id, team=team, gpus=len(gpus), gpus_per_task=len(gpus), ranks_per_task=1, command=("true",)
    )
    bound = GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=(TaskPlacement(task=0, node_id=node_id, gpus=gpus),),
        computed_at_seq=0,
        policy_version="test",
        now=3.0,
        at=3.0,
    )
    return [JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0), bound]


def test_team_nominal_borrowed_and_org_limit_and_usage() -> None:
    events: list[Event] = [
        LeaderEpochStarted(epoch=1, leader_id="s1", at=1.0),
        node("n0"),
        node("n1"),
        *running("n-1", "nlp", "n0", (0, 1, 2, 3, 4)),  # 5 on a nominal of 2: borrows 3
        *running("v-1", "vision", "n1", (0, 1, 2)),  # 3 of 4: borrows nothing
    ]
    state = ClusterState()
    for seq, event in enumerate(events, start=1):
        state.apply(seq, event)
    queues, _ = core_queues(queues_from_obj(QUEUES))
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: state, queues, clock=lambda: 10.0))
    got = {
        (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert got[("rally_team_nominal_quota_gpus", "gpu_type=*,team=nlp")] == 2
    assert got[("rally_team_gpus_borrowed", "team=nlp")] == 3
    assert got[("rally_team_gpus_borrowed", "team=vision")] == 0
    assert got[("rally_team_gpus_borrowed", "team=infra")] == 0
    assert got[("rally_org_gpus_limit", "org=research")] == 12
    assert got[("rally_org_gpus_allocated", "org=research")] == 8  # nlp (via language) + vision
    assert got[("rally_org_gpus_allocated", "org=language")] == 5
    assert ("rally_org_gpus_limit", "org=language") not in got  # an org without a limit only groups
    assert not any(name == "rally_team_nominal_quota_gpus" and "research" in labels for name, labels in got)
