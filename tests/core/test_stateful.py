"""Property-based stateful tests: random clusters and workloads, invariants checked after every cycle."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rallypoint.core import (
    ClusterModel,
    Decisions,
    PendingJob,
    Queue,
    Quota,
    RunningJob,
    Snapshot,
    policy_by_name,
    schedule,
)
from rallypoint.core.units import GPU_MILLI

from .builders import nodes

CLASSES = ("production", "training-high", "training-standard", "development", "best-effort")
PRIO = {
    "production": 1000,
    "training-high": 800,
    "training-standard": 500,
    "development": 200,
    "best-effort": 0,
}
TEAMS = ("a", "b", "c")


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(("fifo", "easy-backfill", "las", "rallypoint")),
        racks=st.integers(1, 3),
        per_rack=st.integers(1, 3),
        gpus=st.sampled_from((4, 8)),
    )
    def setup(self, policy: str, racks: int, per_rack: int, gpus: int) -> None:
        self.policy_name = policy
        self.policy = policy_by_name(policy, {"preemption_protection_s": 0.0} if policy != "fifo" else None)
        self.gpus_per_node = gpus
        self.cluster = ClusterModel(nodes(racks=racks, per_rack=per_rack, gpus=gpus))
        total = racks * per_rack * gpus
        share = total // len(TEAMS)
        self.queues = tuple(
            Queue(name=t, cohort="org", quotas=(Quota(nominal=share, borrowing_limit=total),)) for t in TEAMS
        )
        self.pending: dict[str, PendingJob] = {}
        self.now = 0.0
        self.n = 0
        self.last: Decisions | None = None
        self.waited: dict[str, int] = {}
        # victims asked to stop gracefully: they keep their GPUs (RunningJob.preempting_for set) through
        # one more scheduling cycle, then stop
        self.stopping: set[str] = set()

    @rule(
        size=st.sampled_from((1, 2, 4, 8, 16)),
        team=st.sampled_from(TEAMS),
        cls=st.sampled_from(CLASSES),
        limit=st.sampled_from((None, 100.0, 1000.0)),
        elastic=st.booleans(),
    )
    def submit(self, size: int, team: str, cls: str, limit: float | None, elastic: bool) -> None:
        gpt = min(size, self.gpus_per_node)
        self.n += 1
        kw: dict[str, object] = {}
        if elastic and size >= 2 * gpt:
            kw = {"min_gpus": gpt, "max_gpus": size, "gpu_step": gpt}
        job = PendingJob(
            id=f"j{self.n:04d}",
            team=team,
            priority_class=cls,
            gpus=size,
            gpus_per_task=gpt,
            submit_time=self.now,
            arrival=self.n,
            time_limit_s=limit,
            **kw,  # type: ignore[arg-type]
        )
        self.pending[job.id] = job

    @rule(dt=st.sampled_from((0.0, 10.0, 200.0)), graceful=st.booleans())
    def cycle(self, dt: float, graceful: bool) -> None:
        self.now += dt
        snap = Snapshot(
            now=self.now, cluster=self.cluster, pending=tuple(self.pending.values()), queues=self.queues
        )
        d = schedule(snap, self.policy)
        # same input twice (and pending in another order) -> byte-identical output
        snap2 = Snapshot(
            now=self.now, cluster=self.cluster, pending=tuple(reversed(snap.pending)), queues=self.queues
        )
        assert msgspec.json.encode(schedule(snap2, self.policy)) == msgspec.json.encode(d)
        self._check(d)
        # victims that were already stopping during this cycle have now stopped
        for jid in sorted(self.stopping):
            if jid in self.cluster.running:
                self._requeue(self.cluster.unbind(jid))
        self.stopping.clear()
        self._apply(d, graceful)
        self.last = d

    @precondition(lambda self: bool(self.cluster.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(sorted(self.cluster.running)))
        self.cluster.unbind(jid)

    @rule(data=st.data(), up=st.booleans())
    def node_health(self, data: st.DataObject, up: bool) -> None:
        nid = data.draw(st.sampled_from(sorted(self.cluster.nodes)))
        if not up:
            for jid in sorted(self.cluster.running):
                if any(p.node_id == nid for p in self.cluster.running[jid].placements):
                    self._requeue(self.cluster.unbind(jid))
                    self.stopping.discard(jid)
        self.cluster.set_schedulable(nid, up)

    # --- helpers -------------------------------------------------------------------------------------

    def _requeue(self, rj: RunningJob) -> None:
        self.pending[rj.id] = PendingJob(
            id=rj.id,
            team=rj.team,
            priority_class=rj.priority_class,
            gpus=rj.gpus,
            gpus_per_task=rj.gpus_per_task or rj.gpus // len(rj.placements),
            submit_time=rj.submit_time or 0.0,
            attained_gpu_s=rj.attained_gpu_s + rj.gpus * (self.now - rj.start_time),
            last_preempted_at=self.now,
            arrival=int(rj.id[1:]),
        )

    def _check(self, d: Decisions) -> None:
        ids = set(self.pending)
        bound = [b.job_id for b in d.binds]
        waiting = [r.job_id for r in d.pending]
        # every pending job: bound or exactly one reason; nothing else
        assert sorted(bound + waiting) == sorted(ids)
        used: set[tuple[str, int]] = set()
        for jid, nmask in self.cluster.job_masks.items():
            del jid
            for n, m in nmask:
                used |= {(n, g) for g in range(self.gpus_per_node) if m >> g & 1}
        for b in d.binds:
            job = self.pending[b.job_id]
            # gang all-or-nothing: whole tasks of gpus_per_task, summing to an allowed size
            assert all(len(p.gpus) == job.gpus_per_task for p in b.placements)
            assert sum(len(p.gpus) for p in b.placements) == b.gpus
            lo = job.min_gpus if job.min_gpus is not None else job.gpus
            hi = job.max_gpus if job.max_gpus is not None else job.gpus
            assert lo <= b.gpus <= hi
            for p in b.placements:
                node = self.cluster.nodes[p.node_id]
                assert node.schedulable
                for g in p.gpus:
                    assert 0 <= g < node.gpus
                    assert (p.node_id, g) not in used, "GPU bound twice"
                    used.add((p.node_id, g))
        for r in d.resizes:
            for p in r.add:
                for g in p.gpus:
                    assert (p.node_id, g) not in used, "GPU bound twice (resize)"
                    used.add((p.node_id, g))
        # preemption only of strictly lower rank, or to reclaim borrowed quota
        for p in d.preemptions:
            victim = self.cluster.running[p.victim_id]
            pre = self.pending[p.for_job]
            # a job already stopping for an earlier preemptor is never chosen again
            assert victim.preempting_for is None, (p, victim)
            if p.reason == "priority":
                assert PRIO[victim.priority_class] < PRIO[pre.priority_class]
            elif p.reason == "reclaim":
                assert self.policy_name == "rallypoint"
                # admission is sequential within a cycle: the queue's usage includes this cycle's binds
                q = victim.queue_name
                used_q = self.cluster.usage.get((q, "h100"), 0)
                used_q += sum(b.gpus for b in d.binds if self.pending[b.job_id].queue_name == q)
                assert used_q > self.queues[0].quotas[0].nominal
            elif p.reason == "consolidate":
                # a move, not an eviction: one small task of a class not above the gang's
                assert self.policy_name == "rallypoint"
                assert len(victim.placements) == 1 and victim.gpus < pre.gpus_per_task
                assert PRIO[victim.priority_class] <= PRIO[pre.priority_class]
            else:
                assert p.reason == "las" and self.policy_name in ("las", "rallypoint")
                if self.policy_name == "rallypoint":  # same class only: attained service decides
                    assert PRIO[victim.priority_class] == PRIO[pre.priority_class]
            assert victim.preemptible

    def _apply(self, d: Decisions, graceful: bool = False) -> None:
        for p in d.preemptions:
            if p.victim_id not in self.cluster.running:
                continue
            if graceful:
                rj = self.cluster.running[p.victim_id]
                self.cluster.update_running(msgspec.structs.replace(rj, preempting_for=p.for_job))
                self.stopping.add(p.victim_id)
            else:
                self._requeue(self.cluster.unbind(p.victim_id))
        for r in d.resizes:
            rj = self.cluster.unbind(r.job_id)
            rm = {(p.node_id, p.gpus) for p in r.remove}
            keep = [p for p in rj.placements if (p.node_id, p.gpus) not in rm] + list(r.add)
            keep = [msgspec.structs.replace(p, task=i) for i, p in enumerate(keep)]
            self.cluster.bind(msgspec.structs.replace(rj, gpus=r.gpus, placements=tuple(keep)))
        for b in d.binds:
            job = self.pending.pop(b.job_id)
            self.cluster.bind(
                RunningJob(
                    id=job.id,
                    team=job.team,
                    priority_class=job.priority_class,
                    gpus=b.gpus,
                    gpus_per_task=job.gpus_per_task,
                    placements=b.placements,
                    start_time=self.now,
                    expected_end=self.now + job.time_limit_s if job.time_limit_s else None,
                    min_gpus=job.min_gpus,
                    max_gpus=job.max_gpus,
                    gpu_step=job.gpu_step,
                    attained_gpu_s=job.attained_gpu_s,
                    submit_time=job.submit_time,
                )
            )
        # bounded admission: under rallypoint, a job whose guaranteed quota is free gets admitted (or starts
        # preempting) within a bounded number of cycles
        if self.policy_name == "rallypoint":
            for r in d.pending:
                job = self.pending[r.job_id]
                free_quota = (
                    self.cluster.usage.get((job.team, "h100"), 0) + job.gpus
                    <= self.queues[0].quotas[0].nominal
                )
                healthy = all(n.schedulable for n in self.cluster.nodes.values())
                if free_quota and healthy and r.code not in ("GangTooLarge", "Topology"):
                    self.waited[job.id] = self.waited.get(job.id, 0) + 1
                    assert self.waited[job.id] <= 12, (job, r)
                else:
                    self.waited.pop(job.id, None)

    @invariant()
    def capacity_and_quota(self) -> None:
        if not hasattr(self, "cluster"):
            return
        total = sum(n.gpus for n in self.cluster.nodes.values())
        assert sum(j.gpus for j in self.cluster.running.values()) <= total
        # the grower's index is exactly the running elastic gangs, as binds, resizes and ends leave them
        running = self.cluster.running.values()
        assert self.cluster.elastic == {j.id: j for j in running if j.max_gpus is not None}
        if self.policy_name == "rallypoint":
            for q in self.queues:
                used = self.cluster.usage.get((q.name, "h100"), 0)  # thousandths of a GPU
                lim = q.quotas[0]
                assert used <= (lim.nominal + (lim.borrowing_limit or 0)) * GPU_MILLI


SchedulerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
