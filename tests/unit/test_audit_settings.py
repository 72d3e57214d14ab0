"""The audit replays each epoch's decisions under the settings its scheduler leader recorded.

Given a log written by a leader with a queue configuration and a repair wait that are not the defaults
(its ``SchedulerSettings`` first, as ``SchedulerLoop`` records them), when ``verify_decisions`` reads it
with the defaults, then every bind, reason and requeue recomputes identically, and each kind's counts add
up. Without the record (an old log) the defaults apply, as before; explicit overrides replace recorded
knobs; a record of a deposed epoch is not believed.
"""

from __future__ import annotations

import msgspec
from rallypoint_services.scheduler.leader import scheduler_settings

from rallypoint.audit import Overrides, Tally, verify_decisions
from rallypoint.audit.settings import recorded_settings
from rallypoint.cli.replay import audit_lines
from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES, Queue, Quota
from rallypoint.events import (
    Event,
    GpuInfo,
    JobInterrupted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeHeartbeatLost,
    NodeLost,
    NodeRegistered,
    SchedulerSettings,
    decode,
    encode,
)
from rallypoint.scheduling import SchedulingPolicy, decision_writes
from rallypoint.scheduling.model_sync import ModelSync
from rallypoint.scheduling.repair import REPAIR_WAIT_S, repair_writes
from rallypoint.state import ClusterState

DEFAULTS = SchedulingPolicy("rallypoint")
QUEUES = (Queue(name="nlp", cohort="all", quotas=(Quota(nominal=16, borrowing_limit=0),)),)
CONFIGURED = SchedulingPolicy("rallypoint", queues=QUEUES)
WAIT = 30.0  # rally up's; not the default


class Log:
    """A log as a leader writes it, through the wire format, folded as it grows."""

    def __init__(self) -> None:
        self.records: list[tuple[int, Event]] = []
        self.state = ClusterState()
        self.epoch = 0
        self.policy = DEFAULTS
        self.wait = REPAIR_WAIT_S

    def append(self, *events: Event) -> int:
        for event in events:
            seq = len(self.records) + 1
            stored = decode(encode(event))
            self.records.append((seq, stored))
            self.state.apply(seq, stored)
        return len(self.records)

    def lead(self, policy: SchedulingPolicy, wait: float, *, record: bool = True) -> int:
        """A new leader with these settings: its epoch, then (``record``) its settings. Their seq."""
        self.epoch += 1
        self.policy, self.wait = policy, wait
        self.append(LeaderEpochStarted(epoch=self.epoch, leader_id=f"s{self.epoch}", at=1.0))
        if not record:
            return 0
        settings = scheduler_settings(
            policy,
            epoch=self.epoch,
            leader_id=f"s{self.epoch}",
            queue_file="q.yaml",
            repair_wait_s=wait,
            at=1.0,
        )
        return self.append(settings)

    def cycle(self, now: float) -> list[Event]:
        """The leader's cycle at ``now``: its repairs, then its decisions, appended."""
        model = ModelSync().sync(self.state)
        repairs = repair_writes(
            self.state, model, now, epoch=self.epoch, policy_version=self.policy.version, at=now,
            repair_wait_s=self.wait,
        )  # fmt: skip
        self.append(*(w.event for w in repairs))
        decisions = self.policy.decide(self.state, now)
        writes = decision_writes(
            decisions, self.state, epoch=self.epoch, policy_version=self.policy.version, at=now
        )
        self.append(*(w.event for w in writes))
        return [w.event for w in (*repairs, *writes)]


def node(node_id: str) -> NodeRegistered:
    gpus = tuple(GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
    return NodeRegistered(
        node_id=node_id, address="h", rack="r0", gpu_type="sim", gpus=gpus, cpu_milli=1, memory_mib=1,
        agent_instance="a", at=1.0,
    )  # fmt: skip


def submit(job_id: str, gpus: int, team: str = "nlp") -> JobSubmitted:
    spec = JobSpec(name=job_id, team=team, gpus=gpus, gpus_per_task=8, ranks_per_task=1, command=("true",))
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=2.0)


def requeued_gang(log: Log) -> Log:
    """A 16-GPU gang bound, started, one node lost, requeued after the leader's wait, then pending."""
    log.append(node("n1"), node("n2"), submit("gang", 16))
    log.cycle(10.0)
    log.append(JobStarted(job_id="gang", attempt=1, at=11.0))
    log.append(
        NodeHeartbeatLost(node_id="n2", last_seen=11.0, at=12.0), NodeLost(node_id="n2", reason="x", at=12.0)
    )
    log.append(JobInterrupted(job_id="gang", attempt=1, failed_nodes=("n2",), reason="x", at=12.0))
    log.cycle(12.0 + WAIT + 1.0)  # requeued by a 30 s wait, not yet by the default's 60 s
    log.cycle(50.0)  # why it waits now
    return log


def configured_log(*, record: bool = True) -> tuple[Log, int]:
    log = Log()
    seq = log.lead(CONFIGURED, WAIT, record=record)
    return requeued_gang(log), seq


def counts(tallies: dict[str, Tally]) -> dict[str, tuple[int, ...]]:
    """(total, verified, differ, other policy, refused) of each kind."""
    return {kind: (t.total, t.verified, t.differ, t.other_policy, t.refused) for kind, t in tallies.items()}


def test_the_recorded_settings_replay_every_decision_with_no_flags() -> None:
    log, settings_seq = configured_log()
    report = verify_decisions(log.records, DEFAULTS)
    assert report.ok, audit_lines(report)
    assert counts(report.tallies) == {
        "decisions": (1, 1, 0, 0, 0),
        "reasons": (1, 1, 0, 0, 0),
        "repairs": (1, 1, 0, 0, 0),
    }
    (span,) = report.settings
    assert (span.seq, span.epoch, span.policy_version) == (settings_seq, 1, CONFIGURED.version)
    assert (span.queue_file, span.repair_wait_s, span.decisions) == ("q.yaml", WAIT, 3)
    assert span.overridden == [] and span.recorded_policy_version == ""


def test_a_log_without_the_record_is_replayed_under_the_defaults_as_before() -> None:
    log, _ = configured_log(record=False)
    report = verify_decisions(log.records, DEFAULTS)
    assert not report.ok
    assert counts(report.tallies)["decisions"] == (1, 0, 0, 1, 0)
    assert counts(report.tallies)["repairs"] == (1, 0, 1, 0, 0), "the default wait did not requeue yet"
    (span,) = report.settings
    assert (span.seq, span.policy_version, span.repair_wait_s) == (0, DEFAULTS.version, REPAIR_WAIT_S)
    # the caller's settings are still the way to audit such a log
    assert verify_decisions(log.records, CONFIGURED, repair_wait_s=WAIT).ok


def test_an_explicit_flag_replaces_the_recorded_value_and_says_so() -> None:
    log, _ = configured_log()
    report = verify_decisions(log.records, DEFAULTS, overrides=Overrides(repair_wait_s=REPAIR_WAIT_S))
    assert not report.ok
    assert counts(report.tallies)["repairs"] == (1, 0, 1, 0, 0)
    assert report.settings[0].overridden == ["--repair-wait"]
    assert report.settings[0].repair_wait_s == REPAIR_WAIT_S
    assert "  --repair-wait given: replaces what the scheduler recorded" in audit_lines(report)
    same = Overrides(queue_file="mine.yaml", queues=QUEUES, priority_classes=DEFAULT_PRIORITY_CLASSES)
    report = verify_decisions(log.records, DEFAULTS, overrides=same)
    assert report.ok and report.settings[0].queue_file == "mine.yaml"


def test_each_epoch_is_replayed_under_its_own_settings() -> None:
    """An old leader that recorded nothing, then one with settings: the fallback for the first span."""
    log = Log()
    log.lead(DEFAULTS, REPAIR_WAIT_S, record=False)
    log.append(node("n0"), submit("first", 8, team="vision"))  # no quota: not in the queue file
    log.cycle(5.0)
    settings_seq = log.lead(CONFIGURED, WAIT)
    requeued_gang(log)
    report = verify_decisions(log.records, DEFAULTS)
    assert report.ok, audit_lines(report)
    assert [(s.seq, s.policy_version) for s in report.settings] == [
        (0, DEFAULTS.version),
        (settings_seq, CONFIGURED.version),
    ]
    assert counts(report.tallies)["decisions"] == (2, 2, 0, 0, 0)


def test_only_the_current_epochs_first_record_counts() -> None:
    settings = [
        scheduler_settings(DEFAULTS, epoch=e, leader_id="s", queue_file=None, repair_wait_s=w, at=1.0)
        for e, w in ((1, 1.0), (1, 2.0), (2, 3.0), (1, 4.0))
    ]
    history: list[tuple[int, Event]] = [
        (1, LeaderEpochStarted(epoch=1, leader_id="s", at=1.0)),
        (2, settings[0]),
        (3, settings[1]),  # a second record of epoch 1: the first stands
        (4, LeaderEpochStarted(epoch=2, leader_id="s", at=1.0)),
        (5, settings[3]),  # a deposed leader's, which fencing keeps out of a real log
        (6, settings[2]),
    ]
    found = recorded_settings(history)
    assert {epoch: (seq, s.repair_wait_s) for epoch, (seq, s) in found.items()} == {1: (2, 1.0), 2: (6, 3.0)}


def test_a_record_this_version_cannot_rebuild_counts_its_decisions_as_another_policys() -> None:
    log, settings_seq = configured_log()
    seq, recorded = log.records[settings_seq - 1]
    assert isinstance(recorded, SchedulerSettings)
    log.records[settings_seq - 1] = (seq, msgspec.structs.replace(recorded, policy="from-the-future"))
    report = verify_decisions(log.records, DEFAULTS)
    assert not report.ok and report.settings[0].recorded_policy_version == CONFIGURED.version
    decisions = counts(report.tallies)["decisions"]
    assert decisions == (1, 0, 0, 1, 0)
    line = next(x for x in audit_lines(report) if x.startswith("decisions"))
    assert line.endswith(": 1, each counted once: 0 recomputed identically, 0 differ, 1 made under another "
                         "policy, 0 refused by the fold"), line  # fmt: skip


def test_epochs_that_recorded_the_same_settings_share_one_line() -> None:
    """A scheduler restarted as it was (a new epoch, the same record) adds no line to the report."""
    log, first = configured_log()
    log.lead(CONFIGURED, WAIT)
    log.append(submit("later", 8))
    log.cycle(60.0)
    report = verify_decisions(log.records, DEFAULTS)
    assert report.ok and len(report.settings) == 2
    (line,) = [x for x in audit_lines(report) if x.startswith("settings ")]
    assert line.startswith(f"settings recorded by the scheduler in 2 epochs (1, 2), first at seq {first}: ")
    assert line.endswith(
        f"{sum(s.decisions for s in report.settings)} decisions, reasons and repairs judged under them"
    )
