"""One writer per fact: a node speaks only for ranks it runs, verdicts follow the health monitor's rules, a
node's hardware changes only with an operator, and the audit names every event that does not belong."""

from __future__ import annotations

from test_state_fold import LEADERS, bound, node, submit  # this folder is on sys.path

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import History, audit_lines
from rallypoint.events import (
    Event,
    GpuInfo,
    JobStarted,
    NodeHeartbeatLost,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
    RankExited,
    encode,
    subjects,
)
from rallypoint.events.codec import decode_stored
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ClusterState

# A 2-node gang of 2 ranks per node: ranks 0-1 run on n1, ranks 2-3 on n2.
RUNNING: list[Event] = [
    *LEADERS,
    node("n1"),
    node("n2"),
    submit("j1", 4, per_task=2),
    bound("j1", ("n1", (0, 1)), ("n2", (0, 1))),
    JobStarted(job_id="j1", attempt=1, at=4.0),
]


def exited(node_id: str, rank: int, code: int = 1) -> RankExited:
    return RankExited(job_id="j1", attempt=1, rank=rank, node_id=node_id, exit_code=code, at=5.0)


def stored(*events: Event) -> History:
    """(seq, item) as a live replay gives them: each event decoded on the subject it was written to."""
    return [
        (seq, decode_stored(encode(e), seq=seq, subject=subjects.for_event(e)))
        for seq, e in enumerate(events, 1)
    ]


def audited(history: History) -> tuple[ClusterState, list[str], bool]:
    report = verify_decisions(history, SchedulingPolicy("rallypoint"), allow_other_policies=True)
    state = ClusterState()
    for seq, item in history:
        state.apply_stored(seq, item)
    return state, [t.describe() for t in report.trespasses], report.ok


def test_a_node_speaks_only_for_the_ranks_it_runs() -> None:
    state, trespasses, ok = audited(stored(*RUNNING, exited("n1", 2), exited("n2", 2, code=0)))
    assert state.jobs["j1"].ranks_exited == {2: 0}  # n2's own report of rank 2; n1's forgery changed nothing
    assert state.foreign_exits == 1
    assert trespasses == ["seq 8 RankExited.v1: node n1 does not run rank 2 of j1 attempt 1"]
    assert not ok


def test_a_late_exit_of_an_attempt_that_moved_on_is_no_trespass() -> None:
    late = RankExited(job_id="j1", attempt=0, rank=3, node_id="n1", exit_code=1, at=5.0)
    state, trespasses, ok = audited(stored(*RUNNING, late, exited("n1", 1, code=0)))
    assert state.jobs["j1"].ranks_exited == {1: 0} and state.foreign_exits == 0
    assert trespasses == [] and ok


def test_a_forged_verdict_on_another_writers_subject_fails_the_audit_by_name() -> None:
    lost = NodeLost(node_id="n1", reason="forged", at=5.0)
    forged = (
        len(RUNNING) + 1,
        decode_stored(encode(lost), seq=len(RUNNING) + 1, subject="rally.node.n1.agent"),
    )
    history = [*stored(*RUNNING), forged]
    state, trespasses, ok = audited(history)
    assert state.nodes["n1"].status == "up"
    assert len(trespasses) == 1 and trespasses[0].startswith("seq 8 NodeLost.v1 on rally.node.n1.agent")
    assert "rally.node.n1.health" in trespasses[0] and not ok


def test_a_node_is_lost_only_after_its_heartbeat_was() -> None:
    lost = NodeLost(node_id="n2", reason="no heartbeat for 31 s", at=40.0)
    _, trespasses, ok = audited(stored(*RUNNING, lost))
    assert trespasses == ["seq 8 NodeLost.v1: node n2 lost without its heartbeat lost first"] and not ok

    silent = NodeHeartbeatLost(node_id="n2", last_seen=5.0, at=10.0)
    back = NodeRecovered(node_id="n2", at=50.0)
    _, trespasses, ok = audited(stored(*RUNNING, silent, lost, back))
    assert trespasses == [] and ok
    _, trespasses, _ = audited(stored(*RUNNING, silent, back, back))
    assert trespasses == ["seq 10 NodeRecovered.v1: node n2 recovered without its heartbeat lost first"]


def bigger(node_id: str) -> NodeRegistered:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=0) for i in range(64)
    )
    return NodeRegistered(
        node_id=node_id, address="127.0.0.1", rack="rack-9", gpu_type="sim", gpus=gpus,
        cpu_milli=64_000, memory_mib=512_000, agent_instance="a2", at=6.0,
    )  # fmt: skip


def test_a_reregistration_with_other_hardware_waits_for_an_operator() -> None:
    history = stored(*RUNNING, bigger("n1"))
    report = verify_decisions(history, SchedulingPolicy("rallypoint"), allow_other_policies=True)
    state = ClusterState()
    for seq, item in history:
        state.apply_stored(seq, item)
    n1 = state.nodes["n1"]
    assert (n1.gpu_count, n1.rack, n1.status) == (8, "r0", "drained")
    assert "re-registered as 64 sim GPUs in rack-9" in n1.status_reason
    assert n1.allocated == {0: "j1", 1: "j1"}  # the gang keeps running there
    assert report.held_registrations == {"n1": [8]} and report.ok
    assert "held for an operator: node n1 re-registered with other hardware at seq 8" in audit_lines(report)

    undrain = NodeUndrained(node_id="n1", reason="new board", undrained_by="ops", at=7.0)
    state.apply(9, undrain)
    n1 = state.nodes["n1"]
    assert (n1.gpu_count, n1.rack, n1.status, n1.held_registration) == (64, "rack-9", "up", None)


def test_a_restarted_agent_with_the_same_hardware_is_not_held() -> None:
    again = NodeRegistered(
        **{**{f: getattr(node("n1"), f) for f in node("n1").__struct_fields__}, "agent_instance": "a9"}
    )
    state, trespasses, _ = audited(stored(*RUNNING, again))
    assert state.nodes["n1"].status == "up" and state.nodes["n1"].agent_instance == "a9"
    assert state.nodes["n1"].held_registration is None and trespasses == []


def test_the_audit_names_the_attempts_it_saw() -> None:
    report = verify_decisions(stored(*RUNNING), SchedulingPolicy("rallypoint"), allow_other_policies=True)
    assert report.attempts == {"j1": [1]}
    assert "  j1 attempt 1" in audit_lines(report)
