"""A model kept in step across cycles decides byte for byte as one built from scratch on the same fold.

The live services decide on ``ModelSync``'s model; the audit recomputes on ``build_snapshot``'s. Both must
give the same bytes on the same state, after any history of changes, or the audit would flag the live
scheduler's decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_state_fold import led_state

from rallypoint.core import policy_by_name, schedule
from rallypoint.core.types import Queue, Quota
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    HealthEvidence,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    MigSlice,
    NodeDrained,
    NodeHeartbeatLost,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
    PreemptionRequested,
    TaskPlacement,
)
from rallypoint.scheduling import ModelSync, SchedulingPolicy, build_snapshot
from rallypoint.scheduling.bridge import node_of, pending_of, running_of
from rallypoint.scheduling.model_sync import NODE_FIELDS, PENDING_FIELDS, RUNNING_FIELDS
from rallypoint.state import CheckpointView, ClusterState, NodeView, ResizeView

POLICIES = {name: policy_by_name(name) for name in ("fifo", "easy-backfill", "las", "rallypoint")}
QUEUES = (
    Queue(name="org", quotas=(Quota(nominal=24),)),
    Queue(name="nlp", parent="org", quotas=(Quota(nominal=16),)),
    Queue(name="vision", parent="org", quotas=(Quota(nominal=8, borrowing_limit=8),)),
)
CLASSES = ("production", "training-high", "training-standard", "development", "best-effort")
HALVES = ((0, 1, 2, 3), (4, 5, 6, 7))


class World:
    """A fold fed one event at a time, with the helpers a scenario needs to write valid events."""

    def __init__(self) -> None:
        self.state = led_state()
        self.seq = 0
        self.now = 100.0
        self.jobs = 0

    def apply(self, event: Event) -> None:
        self.seq += 1
        self.now += 1.0
        self.state.apply(self.seq, event)

    def node(
        self,
        node_id: str,
        *,
        rack: str = "r0",
        spine: str = "s0",
        gpu_type: str = "h100",
        gpus: int = 8,
        domains: tuple[tuple[int, ...], ...] = (),
        cpu_milli: int = 64_000,
    ) -> None:
        dom = {g: d for d, members in enumerate(domains) for g in members}
        self.apply(
            NodeRegistered(
                node_id=node_id,
                address="10.0.0.1",
                rack=rack,
                spine=spine,
                gpu_type=gpu_type,
                gpus=tuple(
                    GpuInfo(index=i, uuid=f"{node_id}-{i}", memory_mib=80_000, nvlink_domain=dom.get(i, 0))
                    for i in range(gpus)
                ),
                cpu_milli=cpu_milli,
                memory_mib=512_000,
                agent_instance=f"a{self.seq}",
                at=self.now,
            )
        )
        if self.state.nodes[node_id].held_registration is not None:  # other hardware: an operator accepts it
            self.apply(NodeUndrained(node_id=node_id, reason="reshaped", undrained_by="ops", at=self.now))

    def submit(
        self,
        gpus: int,
        *,
        per_task: int | None = None,
        team: str = "nlp",
        priority: str = "training-standard",
        time_limit_s: int | None = 600,
        elastic: bool = False,
    ) -> str:
        self.jobs += 1
        job_id = f"j{self.jobs:03d}"
        per = per_task if per_task is not None else min(gpus, 8)
        spec = JobSpec(
            name=job_id,
            team=team,
            gpus=gpus,
            gpus_per_task=per,
            ranks_per_task=1,
            command=("true",),
            priority=priority,
            time_limit_s=time_limit_s,
            min_gpus=per if elastic else None,
            max_gpus=gpus * 2 if elastic else None,
            gpu_step=per if elastic else None,
        )
        self.apply(JobSubmitted(job_id=job_id, spec=spec, submitted_at=self.now))
        return job_id

    def bind(self, job_id: str, *tasks: tuple[str, tuple[int, ...]]) -> None:
        job = self.state.jobs[job_id]
        self.apply(
            GangBound(
                job_id=job_id,
                attempt=job.attempt + 1,
                epoch=1,
                placements=tuple(TaskPlacement(task=i, node_id=n, gpus=g) for i, (n, g) in enumerate(tasks)),
                computed_at_seq=self.seq,
                policy_version="test",
                now=self.now,
                at=self.now,
            )
        )

    def first_fit(self, job_id: str) -> bool:
        """Bind ``job_id`` on the first free GPUs of schedulable nodes, one task per node; False if none."""
        spec = self.state.jobs[job_id].spec
        tasks: list[tuple[str, tuple[int, ...]]] = []
        for nid in sorted(self.state.nodes):
            view = self.state.nodes[nid]
            free = view.free_gpus()
            if view.schedulable and len(free) >= spec.gpus_per_task:
                tasks.append((nid, free[: spec.gpus_per_task]))
                if len(tasks) * spec.gpus_per_task == spec.gpus:
                    self.bind(job_id, *tasks)
                    return True
        return False

    def start(self, job_id: str) -> None:
        self.apply(JobStarted(job_id=job_id, attempt=self.state.jobs[job_id].attempt, at=self.now))

    def ask_preempt(self, job_id: str, for_job: str) -> None:
        attempt = self.state.jobs[job_id].attempt
        self.apply(
            PreemptionRequested(
                job_id=job_id,
                attempt=attempt,
                for_job=for_job,
                reason="priority",
                epoch=1,
                computed_at_seq=self.seq,
                policy_version="test",
                now=self.now,
                at=self.now,
            )
        )

    def preempted(self, job_id: str) -> None:
        job = self.state.jobs[job_id]
        for_job = job.preempt_for or "someone"
        self.apply(
            JobPreempted(job_id=job_id, attempt=job.attempt, for_job=for_job, reason="priority", at=self.now)
        )

    def complete(self, job_id: str) -> None:
        self.apply(JobCompleted(job_id=job_id, attempt=self.state.jobs[job_id].attempt, at=self.now))

    def fail(self, job_id: str) -> None:
        attempt = self.state.jobs[job_id].attempt
        self.apply(
            JobFailed(job_id=job_id, attempt=attempt, reason="rank 0 exited 1", exit_code=1, at=self.now)
        )

    def apply_decisions(self) -> None:
        """Fold what the rallypoint policy decides now: its binds and its preemption requests."""
        decisions = schedule(build_snapshot(self.state, self.now, queues=QUEUES), POLICIES["rallypoint"])
        for b in decisions.binds:
            self.bind(b.job_id, *((p.node_id, p.gpus) for p in b.placements))
        for p in decisions.preemptions:
            victim = self.state.jobs.get(p.victim_id)
            if victim is not None and victim.state in ("bound", "running") and victim.preempt_for is None:
                self.ask_preempt(p.victim_id, p.for_job)

    def with_state(self, state: str) -> list[str]:
        return sorted(j.job_id for j in self.state.jobs.values() if j.state == state)

    def active(self) -> list[str]:
        return self.with_state("bound") + self.with_state("running")


def assert_same(sync: ModelSync, state: ClusterState, now: float) -> None:
    fresh = build_snapshot(state, now, queues=QUEUES)
    synced = sync.snapshot(state, now, queues=QUEUES)
    assert synced.pending == fresh.pending
    assert synced.cluster.running == fresh.cluster.running
    assert synced.cluster.nodes == fresh.cluster.nodes
    for name, policy in POLICIES.items():
        want = msgspec.json.encode(schedule(fresh, policy))
        got = msgspec.json.encode(schedule(synced, policy))
        assert got == want, name


def test_a_scripted_history_decides_identically_at_every_step_without_rebuilding() -> None:
    w = World()
    sync = ModelSync()
    policy = SchedulingPolicy("rallypoint", queues=QUEUES)

    def check() -> None:
        assert_same(sync, w.state, w.now)
        assert msgspec.json.encode(policy.decide_live(w.state, w.now)) == msgspec.json.encode(
            policy.decide(w.state, w.now)
        )

    check()  # empty cluster
    for k in range(4):
        w.node(f"n{k}", rack=f"r{k // 2}", domains=HALVES if k % 2 else ())
        check()
    low = w.submit(16, priority="best-effort", time_limit_s=None)
    small = w.submit(4, team="vision", priority="development")
    grow = w.submit(8, team="vision", elastic=True)
    check()
    w.bind(low, ("n0", tuple(range(8))), ("n1", tuple(range(8))))
    check()
    w.bind(small, ("n2", (0, 1, 2, 3)))
    w.start(low)
    check()
    w.first_fit(grow)
    w.start(small)
    check()
    urgent = w.submit(16, priority="production")
    check()  # the policy now wants to preempt
    w.ask_preempt(low, urgent)
    check()  # the victim is stopping: preempting_for is set, same placements
    w.apply(NodeDrained(node_id="n3", reason="maintenance", at=w.now))
    check()
    w.preempted(low)
    check()  # back to pending, GPUs free, last_preempted_at set
    w.apply_decisions()
    check()
    w.apply(NodeRecovered(node_id="n3", at=w.now))
    check()
    w.fail(small)
    check()
    w.node("n4", rack="r2")
    w.node("n2", rack="r1")  # an agent restart: a new view, the same inventory
    check()
    w.apply(NodeHeartbeatLost(node_id="n1", last_seen=w.now, at=w.now))
    w.apply(NodeLost(node_id="n1", reason="gone", at=w.now))
    check()
    for job_id in w.active():
        w.complete(job_id)
    check()
    w.apply(NodeRecovered(node_id="n1", at=w.now))
    w.apply_decisions()
    check()
    assert sync.counts.rebuilds == 1  # only the first sync built from scratch
    assert sync.counts.binds and sync.counts.unbinds and sync.counts.updates and sync.counts.nodes_changed
    assert policy.model_sync.counts.rebuilds == 1


def test_a_reshaped_node_rebuilds_and_still_agrees() -> None:
    w = World()
    sync = ModelSync()
    w.node("n0")
    w.node("n1")
    job = w.submit(8)
    w.bind(job, ("n1", tuple(range(8))))
    w.submit(4, priority="production")
    assert_same(sync, w.state, w.now)
    w.node("n0", domains=HALVES)  # new NVLink layout: the index cannot patch that in place
    assert_same(sync, w.state, w.now)
    w.node("n1", rack="r9", cpu_milli=1)  # moved, with a job bound on it
    assert_same(sync, w.state, w.now)
    assert sync.counts.rebuilds == 3


def test_another_state_is_diffed_by_value_restored_or_smaller() -> None:
    w = World()
    sync = ModelSync()
    for k in range(3):
        w.node(f"n{k}")
    for _ in range(4):
        w.submit(4)
    w.apply_decisions()
    assert_same(sync, w.state, w.now)
    counts = msgspec.structs.replace(sync.counts)
    # a follower restored from a snapshot: every view is a new object with the same values
    restored = ClusterState.decode(w.state.encode())
    assert_same(sync, restored, w.now)
    assert (sync.counts.rebuilds, sync.counts.binds, sync.counts.unbinds) == (
        counts.rebuilds,
        counts.binds,
        counts.unbinds,
    )
    # a state without one of the nodes (the fold never drops one, but a caller may pass anything)
    smaller = ClusterState()
    smaller.apply(1, _registered(w.state.nodes["n0"]))
    assert_same(sync, smaller, w.now)
    assert sync.counts.rebuilds == counts.rebuilds + 1
    assert_same(sync, w.state, w.now)  # back: only the missing nodes are added
    assert sync.counts.rebuilds == counts.rebuilds + 1
    assert sync.counts.nodes_added == counts.nodes_added + 2


def _registered(view: NodeView) -> NodeRegistered:
    return NodeRegistered(
        node_id=view.node_id,
        address=view.address,
        rack=view.rack,
        spine=view.spine,
        gpu_type=view.gpu_type,
        gpus=view.gpus,
        cpu_milli=view.cpu_milli,
        memory_mib=view.memory_mib,
        agent_instance=view.agent_instance,
        at=view.registered_at,
    )


def test_a_sync_that_raises_starts_over_next_time() -> None:
    w = World()
    sync = ModelSync()
    w.node("n0")
    job = w.submit(8)
    w.bind(job, ("n0", tuple(range(8))))
    assert_same(sync, w.state, w.now)
    # not a state the fold can produce: a GPU held by two jobs
    clash = w.submit(8)
    w.state.jobs[clash] = msgspec.structs.replace(
        w.state.jobs[clash], state="bound", placements=w.state.jobs[job].placements
    )
    for build in (lambda: build_snapshot(w.state, w.now), lambda: sync.snapshot(w.state, w.now)):
        try:
            build()
        except ValueError:
            pass
        else:
            raise AssertionError("a double bind must raise")
    w.state.jobs[clash] = msgspec.structs.replace(w.state.jobs[clash], state="pending", placements=())
    rebuilds = sync.counts.rebuilds
    assert_same(sync, w.state, w.now)
    assert sync.counts.rebuilds == rebuilds + 1


# --- the signatures cover every field the bridge reads -------------------------------------------


def test_the_signatures_hold_every_field_the_bridge_reads() -> None:
    """Changing any view field outside a signature leaves what the bridge derives unchanged, and every
    view field is either in the signature or changed here (a new field must be placed on one side)."""
    w = World()
    w.node("n0", domains=HALVES)
    job_id = w.submit(8, elastic=True)
    w.bind(job_id, ("n0", tuple(range(8))))
    w.start(job_id)
    job = w.state.jobs[job_id]
    node = w.state.nodes["n0"]
    job_others: dict[str, object] = {
        "submitted_seq": 999,
        "state": "pending",
        "queue": "elsewhere",
        "attempt": 7,
        "bound_seq": 999,
        "ended_at": 5.0,
        "exit_code": 3,
        "reason": "x",
        "pending_code": "x",
        "pending_message": "x",
        "pending_position": 3,
        "pending_at": 2.0,
        "cancel_requested": True,
        "suspend_requested": True,
        "suspended_at": 3.0,
        "suspended_s": 4.0,
        "ranks_exited": {0: 1},
        "preempt_reason": "x",
        "preemptions": 9,
        "run_s": 9.0,
        "user": "x",  # read by pending_of only (the fair share between a team's users)
        "user_failures": 2,
        "infra_failures": 3,
        "retry_at": 7.0,
        "failed_nodes": ("x",),
        "missing_tasks": (3,),
        "interrupted_at": 4.0,
        "lost_gpu_s": 11.0,
        "resume_step": 5,
        "attempt_reasons": ["x"],
        "checkpoints": [
            CheckpointView(
                step=1,
                attempt=1,
                path="x",
                manifest_sha256="x",
                bytes=1,
                shards=1,
                save_s=1.0,
                committed_at=1.0,
            )
        ],
        "last_seq": 999,
    }
    node_others: dict[str, object] = {
        "address": "x",
        "status_reason": "x",
        "agent_instance": "x",
        "registered_at": 5.0,
        "allocated": {0: "other"},
        "shares": {0: {"other": 100}},
        "slices": {0: {"other": MigSlice(profile="1g.10gb", start=0)}},
        "health_since": 9.0,
        "health_evidence": (
            HealthEvidence(signal="xid", subject="gpu 0", severity="failed", value=79, threshold=79),
        ),
        "degraded_at": (3.0,),
        "out_since": 4.0,
        # what labels and taints are made of (the bridge reads the merged labels and taints)
        "agent_labels": {"x": "y"},
        "agent_taints": ("x",),
        "operator_labels": {"x": "z"},
        "operator_taints": ("y",),
        "held_registration": NodeRegistered(
            node_id="n0",
            address="x",
            rack="x",
            gpu_type="x",
            gpus=(),
            cpu_milli=1,
            memory_mib=1,
            agent_instance="x",
            at=1.0,
        ),
    }
    pending_only: dict[str, object] = {
        "last_checkpoint_at": 1.0,
        "bound_at": 1.0,
        "started_at": 1.0,
        "placements": (),
        "preempt_for": "x",
        "resize": ResizeView(attempt=2, placements=(), reason="x", at=1.0),
    }
    pending_others = {
        k: v for k, v in job_others.items() if k not in ("submitted_seq", "run_s", "user")
    } | pending_only
    cases: list[tuple[msgspec.Struct, dict[str, object], tuple[str, ...], Callable[[Any], object]]] = [
        (job, job_others, RUNNING_FIELDS, running_of),
        (node, node_others, NODE_FIELDS, node_of),
        (job, pending_others, PENDING_FIELDS, pending_of),
    ]
    for obj, others, keep, derive in cases:
        fields = {f.name for f in msgspec.structs.fields(obj)}
        assert fields == set(keep) | set(others), derive
        for name, value in others.items():
            assert getattr(obj, name) != value, name
            assert derive(msgspec.structs.replace(obj, **{name: value})) == derive(obj), name


# --- random histories ------------------------------------------------------------------------------

OPS = (
    "node", "reregister", "reshape", "drain", "recover", "lose", "submit", "submit", "decide", "decide",
    "first_fit", "start", "ask_preempt", "preempted", "complete", "fail", "cancel", "wait",
)  # fmt: skip


def _step(w: World, op: str, pick: int) -> None:
    nodes = sorted(w.state.nodes)
    pending = w.with_state("pending")
    active = w.active()

    def one(xs: list[str]) -> str | None:
        return xs[pick % len(xs)] if xs else None

    if op == "node" or not nodes:
        k = len(nodes)
        w.node(f"n{k:02d}", rack=f"r{k // 3}", spine=f"s{k // 6}", domains=HALVES if pick % 2 else ())
    elif op == "reregister":
        w.node(nid := nodes[pick % len(nodes)], rack=w.state.nodes[nid].rack, spine=w.state.nodes[nid].spine)
    elif op == "reshape":
        view = w.state.nodes[nodes[pick % len(nodes)]]
        w.node(view.node_id, rack=view.rack, spine=view.spine, domains=() if pick % 2 else HALVES)
    elif op == "drain":
        w.apply(NodeDrained(node_id=nodes[pick % len(nodes)], reason="x", at=w.now))
    elif op == "recover":
        w.apply(NodeRecovered(node_id=nodes[pick % len(nodes)], at=w.now))
    elif op == "lose":
        w.apply(NodeLost(node_id=nodes[pick % len(nodes)], reason="x", at=w.now))
    elif op == "submit":
        gpus = (1, 2, 4, 8, 16)[pick % 5]
        w.submit(
            gpus,
            team=("nlp", "vision")[pick % 2],
            priority=CLASSES[pick % len(CLASSES)],
            time_limit_s=(None, 60, 600)[pick % 3],
            elastic=pick % 7 == 0 and gpus <= 8,
        )
    elif op == "decide":
        w.apply_decisions()
    elif op == "first_fit" and (job := one(pending)):
        w.first_fit(job)
    elif op == "start" and (job := one(w.with_state("bound"))):
        w.start(job)
    elif op == "ask_preempt" and (job := one(active)) and pending:
        w.ask_preempt(job, pending[pick % len(pending)])
    elif op == "preempted" and (job := one(active)):
        w.preempted(job)
    elif op == "complete" and (job := one(active)):
        w.complete(job)
    elif op == "fail" and (job := one(active + pending)):
        w.fail(job)
    elif op == "cancel" and (job := one(pending)):
        w.apply(JobCancelRequested(job_id=job, at=w.now))
        w.apply(JobCancelled(job_id=job, at=w.now))
    else:
        w.now += 30.0


def _busy_world() -> World:
    """Six nodes in two spines, mostly full of low-priority gangs: room for preemption and backfill."""
    w = World()
    for k in range(6):
        w.node(f"n{k:02d}", rack=f"r{k // 3}", spine=f"s{k // 6}", domains=HALVES if k % 2 else ())
    for k in range(5):
        w.submit((4, 8, 16)[k % 3], team=("nlp", "vision")[k % 2], priority=CLASSES[3 + k % 2])
    w.apply_decisions()
    for job in w.with_state("bound")[:3]:
        w.start(job)
    return w


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), min_size=5, max_size=40))
def test_random_histories_decide_identically_at_every_step(steps: list[tuple[str, int]]) -> None:
    w = _busy_world()
    sync = ModelSync()
    assert_same(sync, w.state, w.now)
    for op, pick in steps:
        _step(w, op, pick)
        assert_same(sync, w.state, w.now)


def test_decide_keeps_no_model_for_the_audit() -> None:
    """The audit folds to arbitrary sequences, one state after another: ``decide`` never syncs."""
    policy = SchedulingPolicy("rallypoint", queues=QUEUES)
    w = _busy_world()
    early = ClusterState.decode(w.state.encode())
    for _ in range(3):
        w.submit(8, priority="production")
    w.apply_decisions()
    for state in (w.state, early, w.state):
        got = msgspec.json.encode(policy.decide(state, w.now))
        fresh = schedule(build_snapshot(state, w.now, queues=QUEUES), POLICIES["rallypoint"])
        assert got == msgspec.json.encode(fresh)
    assert policy.model_sync.counts.syncs == 0
