"""A job that accepts several GPU types goes from the log to the core and binds on an allowed type."""

from __future__ import annotations

from typing import Any

from test_state_fold import led_state

from rallypoint.core import policy_by_name, schedule
from rallypoint.events import GangBound, GpuInfo, JobSpec, JobSubmitted, NodeRegistered
from rallypoint.scheduling import build_snapshot
from rallypoint.state import ClusterState


def node(node_id: str, gpu_type: str) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        address="127.0.0.1",
        rack="r0",
        gpu_type=gpu_type,
        gpus=tuple(
            GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(8)
        ),
        cpu_milli=64_000,
        memory_mib=512_000,
        agent_instance="a1",
        at=1.0,
    )


def submit(job_id: str, **types: Any) -> JobSubmitted:
    spec = JobSpec(
        name=job_id, team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",), **types
    )
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)


def test_a_job_accepting_two_types_binds_on_one_of_them_and_counts_against_that_type() -> None:
    state = led_state()
    events = [node("a", "A100"), node("h", "H100"), node("l", "L40"), submit("j", gpu_types=("L40", "H100"))]
    for seq, e in enumerate(events, start=1):
        state.apply(seq, e)
    policy = policy_by_name("rallypoint")
    decisions = schedule(build_snapshot(state, 10.0), policy)
    [bind] = decisions.binds
    assert [p.node_id for p in bind.placements] == ["l"]  # the first type listed, while it has room

    state.apply(
        5,
        GangBound(
            job_id="j",
            attempt=1,
            epoch=1,
            placements=bind.placements,
            computed_at_seq=4,
            policy_version="test",
            now=10.0,
            at=10.0,
        ),
    )
    state.apply(6, submit("k", gpu_types=("L40", "H100")))
    snapshot = build_snapshot(state, 11.0)
    # the running job is counted on the type of the node it runs on, which the bridge leaves to the model
    assert snapshot.cluster.job_gpu_type(snapshot.cluster.running["j"]) == "L40"
    [second] = schedule(snapshot, policy).binds
    assert [p.node_id for p in second.placements] == ["h"]  # L40 is full: the next type listed


def test_a_job_with_one_allowed_type_never_binds_elsewhere() -> None:
    state = ClusterState()
    for seq, e in enumerate([node("a", "A100"), node("h", "H100"), submit("j", gpu_type="H100")], start=1):
        state.apply(seq, e)
    [bind] = schedule(build_snapshot(state, 10.0), policy_by_name("rallypoint")).binds
    assert [p.node_id for p in bind.placements] == ["h"]
