"""The audit recomputes repairs and requeues of interrupted gangs, as it recomputes binds.

Given a gang interrupted by a lost node and the scheduler's repair (``repair_writes`` on the fold at that
point, as the leader runs it), when ``verify_decisions`` reads the log, then it finds the same repair
again; a repair that swapped in another node than the scheduler would have, or a requeue recomputed with
another repair wait than the scheduler's, is a mismatch that fails the audit.
"""

from __future__ import annotations

import msgspec
from test_state_fold import EIGHT, LEADERS, bound, node

from rallypoint.audit import verify_decisions
from rallypoint.events import (
    Event,
    GangRepaired,
    JobCancelled,
    JobCancelRequested,
    JobInterrupted,
    JobRequeued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeHeartbeatLost,
    NodeLost,
    NodeSwap,
    TaskPlacement,
    decode,
    encode,
)
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.model_sync import ModelSync
from rallypoint.scheduling.repair import repair_writes
from rallypoint.state import ClusterState

POLICY = SchedulingPolicy("rallypoint")


def gang(job_id: str) -> JobSubmitted:
    spec = JobSpec(name=job_id, team="nlp", gpus=16, gpus_per_task=8, ranks_per_task=1, command=("train",))
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)


class Log:
    """A log as the audit reads it, (seq, event) through the wire format, and the fold at its tip."""

    def __init__(self, *events: Event) -> None:
        self.records: list[tuple[int, Event]] = []
        self.state = ClusterState()
        self.append(*LEADERS, *events)

    def append(self, *events: Event) -> None:
        for event in events:
            seq = len(self.records) + 1
            stored = decode(encode(event))
            self.records.append((seq, stored))
            self.state.apply(seq, stored)

    def repair(self, now: float, wait: float) -> list[Event]:
        """What the scheduler leader writes for the interrupted gangs at ``now``, appended."""
        model = ModelSync().sync(self.state)
        writes = repair_writes(
            self.state, model, now, epoch=1, policy_version=POLICY.version, at=now, repair_wait_s=wait
        )
        events = [w.event for w in writes]
        self.append(*events)
        return events


def lost(node_id: str, at: float) -> tuple[NodeHeartbeatLost, NodeLost]:
    """A node's loss as the health monitor writes it: its heartbeat lost first (the audit checks that)."""
    silent = NodeHeartbeatLost(node_id=node_id, last_seen=at - 1.0, at=at)
    return silent, NodeLost(node_id=node_id, reason="gone", at=at)


def interrupted(*lost_early: str) -> Log:
    """j1 on n1 (rack r0) and n2 (rack r1) loses n2 at t=30; n3 (r0) and n4 (r1) are free unless lost."""
    log = Log(
        *(node(n, rack=r) for n, r in (("n1", "r0"), ("n2", "r1"), ("n3", "r0"), ("n4", "r1"))),
        *(event for n in lost_early for event in lost(n, at=1.0)),
        gang("j1"),
        bound("j1", ("n1", EIGHT), ("n2", EIGHT)),
        JobStarted(job_id="j1", attempt=1, at=10.0),
        *lost("n2", at=30.0),
    )
    log.append(JobInterrupted(job_id="j1", attempt=1, failed_nodes=("n2",), reason="gone", at=31.0))
    return log


def audit(log: Log, wait: float = 60.0) -> tuple[int, int, list[tuple[str, str, str]]]:
    # the bind in these logs is a test's (policy "test"): only the repairs are recomputed here
    report = verify_decisions(log.records, POLICY, allow_other_policies=True, repair_wait_s=wait)
    assert not report.refused
    return (
        report.repairs,
        report.repairs_verified,
        [(m.kind, m.recorded, m.recomputed) for m in report.mismatches],
    )


def test_a_swap_the_scheduler_made_is_found_again() -> None:
    log = interrupted()
    [repair] = log.repair(now=32.0, wait=60.0)
    assert isinstance(repair, GangRepaired) and [s.to_node for s in repair.swaps] == ["n3"]
    assert audit(log) == (1, 1, [])


def test_a_swap_onto_another_free_node_than_the_schedulers_fails_the_audit() -> None:
    log = interrupted()
    placements = (
        TaskPlacement(task=0, node_id="n1", gpus=EIGHT),
        TaskPlacement(task=1, node_id="n4", gpus=EIGHT),
    )
    log.append(
        GangRepaired(
            job_id="j1", attempt=2, epoch=1, placements=placements,
            swaps=(NodeSwap(task=1, from_node="n2", to_node="n4"),),
            computed_at_seq=len(log.records), policy_version=POLICY.version, now=32.0, at=32.0,
        )
    )  # fmt: skip
    assert log.state.jobs["j1"].state == "bound"  # the fold took it: valid, just not the scheduler's choice
    repairs, verified, [(kind, recorded, recomputed)] = audit(log)
    assert (repairs, verified, kind) == (1, 0, "GangRepaired")
    assert '"to_node":"n4"' in recorded and '"to_node":"n3"' in recomputed


def test_a_requeue_is_recomputed_with_the_schedulers_repair_wait() -> None:
    log = interrupted("n3", "n4")
    assert log.repair(now=60.0, wait=60.0) == []  # nowhere to go yet, and not waited long enough
    [requeue] = log.repair(now=91.5, wait=60.0)
    assert isinstance(requeue, JobRequeued)
    assert audit(log, wait=60.0) == (1, 1, [])
    # another wait: the recorded reason names 60 s, a shorter one would have requeued it (naming its own)
    _, _, [(kind, recorded, recomputed)] = audit(log, wait=30.0)
    assert kind == "JobRequeued" and "within 60 s" in recorded and "within 30 s" in recomputed
    # a longer one would still have waited
    assert audit(log, wait=120.0)[2] == [("JobRequeued", f"requeued: {requeue.reason}", "no repair")]


def test_the_report_says_how_many_repairs_were_recomputed() -> None:
    log = interrupted()
    log.repair(now=32.0, wait=60.0)
    report = verify_decisions(log.records, POLICY, allow_other_policies=True)
    built = msgspec.to_builtins(report)
    assert (built["repairs"], built["repairs_verified"], built["repair_wait_s"]) == (1, 1, 60.0)
    assert report.ok


def test_a_requeue_overtaken_by_a_cancel_is_listed_and_passes() -> None:
    log = interrupted("n3", "n4")
    model = ModelSync().sync(log.state)
    writes = repair_writes(
        log.state, model, 91.5, epoch=1, policy_version=POLICY.version, at=91.5, repair_wait_s=60.0
    )
    # the job is cancelled between the scheduler's computation and its append
    log.append(
        JobCancelRequested(job_id="j1", at=91.6),
        JobCancelled(job_id="j1", attempt=1, at=91.7),
        *(w.event for w in writes),
    )
    report = verify_decisions(log.records, POLICY, allow_other_policies=True)
    assert [(r.kind, r.refusal) for r in report.overtaken] == [("JobRequeued", "overtaken")]
    assert (report.repairs, report.repairs_verified, report.mismatches) == (1, 1, [])
    assert report.ok
