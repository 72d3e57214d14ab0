"""A seeded chaos run on a real local cluster: `python -m tests.chaos.monkey --steps 40 --seed 7`.

Each step submits a trickle of jobs (short ones that succeed, ones that fail, long ones cancelled a step
later), then does one fault drawn from the seed: kill -9 or SIGSTOP of a service, kill -9 of an agent, a
frozen node (its agent and ranks, sometimes past the lost timeout), kill -9 of nats-server, a poison message
(undecodable bytes, or an event version no service knows) or a forged bind (epoch 0, written raw as a
rogue writer on the scheduler's subjects would). Every fifth step (1, 6, ...) also submits a hostile tenant's
job (``tests/e2e/tenant_attack.py``, as team nlp): it looks for credentials and tries every forgery of
issue 30 against a running chaos job and its node; it must complete, and the bus must have refused every
identity it tried. Whatever dies is brought back by the cluster's supervisor
(``LocalCluster.supervise``, as `rally up` does). After every step:

- no acknowledged job is lost (every 202's job id is known to the API and to the log);
- no GPU is bound twice (the active jobs' placements in a fresh fold of the log never overlap);
- the state hash the API serves equals a fresh replay's to the same sequence;
- the fold quarantined exactly the poison messages published, nothing else;
- PostgreSQL's read model equals a fresh fold of the log at the projector's position.

``--nats-servers 3 --replicas 2`` runs the same on a three-server JetStream cluster (R3 stream and buckets)
with two replicas of every service (issue 34). Its faults then take turns, in an order drawn from the seed,
so every kind comes within the first steps: kill -9 of any one nats-server, of any service replica, of a
replica and a server together, a node frozen past the lost timeout under a two-node gang (a repair), an
agent's kill, a paused replica, a poison message and a forged bind. The trickle then has two-node gangs too.
After every step, also: no double action (one JobStarted per attempt, one end per job, one verification
per checkpoint step), which replicas sharing partitions must never write.

At the end every job must reach its right final state (completed / failed / cancelled), the projector must
have caught up with the log, and the audit (``rally replay --verify-decisions``) must recompute every
scheduler decision identically, refuse exactly the forged ones and find no event that is not its writer's.
``make chaos`` runs it for 30 minutes (``--minutes``) with a summary table;
``tests/chaos/test_chaos_short.py`` runs a short one in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from rallypoint.audit import verify_decisions
from rallypoint.cli.replay import History, read_history
from rallypoint.eventlog import EventLog, EventLogError
from rallypoint.events import (
    CheckpointVerified,
    GangBound,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobStarted,
    TaskPlacement,
    subjects,
)
from rallypoint.events.codec import Quarantined
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.localcluster.supervisor import REPLICATED, local_service_seconds
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import ACTIVE, ClusterState

TERMINAL = {"completed", "failed", "cancelled", "rejected"}
FAULTS = ("kill-service", "stop-service", "kill-agent", "freeze-node", "kill-nats", "poison", "forge")
#: On a JetStream cluster with replicas (issue 34): any one server, any replica, or both at once; each kind
#: once per round, so a short run meets them all.
REPLICATED_FAULTS = (
    "kill-service",
    "kill-nats",
    "kill-service+nats",
    "freeze-node",
    *FAULTS[1:3],
    *FAULTS[5:],
)
#: The events that end a job: at most one each, however many job controllers there are.
ENDS = (JobCompleted, JobFailed, JobCancelled)
#: What a rolling upgrade or a broken client may write: bytes no decoder reads, a version nobody knows.
POISON = (
    b"\x00junk",
    b'{"type":"JobSubmitted.v9","job_id":"chaos-v9","spec":{"name":"x"},"submitted_at":1.0}',
)
#: A hostile tenant's job on these steps (1, 6, 11, ...): the same script as the end-to-end tenant test.
TENANT_EVERY = 5
ATTACK = Path(__file__).resolve().parent.parent / "e2e" / "tenant_attack.py"
TENANT_TEAM = "nlp"
#: The local cluster's scheduler policy (no queue file): the audit recomputes its decisions.
POLICY = SchedulingPolicy("rallypoint")
# the local cluster's scheduler's --repair-wait: the audit recomputes its requeues with it
REPAIR_WAIT_S = local_service_seconds("scheduler", "--repair-wait")


@dataclass
class Submitted:
    job_id: str
    kind: str  # "ok", "fails", "cancel", "gang" (two nodes, long enough to meet a fault) or "tenant"
    expected: str
    step: int


@dataclass
class Step:
    number: int
    fault: str
    target: str
    seconds: float
    submitted: int
    checks: str = ""
    took_s: float = 0.0


@dataclass
class ChaosResult:
    seed: int
    steps: list[Step] = field(default_factory=list)
    jobs: dict[str, Submitted] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    poison_seqs: list[int] = field(default_factory=list)
    forged_seqs: list[int] = field(default_factory=list)
    audit: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        lines = [
            f"chaos seed {self.seed}: {len(self.steps)} steps in {self.elapsed_s / 60:.1f} min, "
            f"{len(self.jobs)} jobs acknowledged",
            "",
        ]
        lines.append(f"{'step':>4}  {'fault':<13} {'target':<15} {'s':>5} {'jobs':>4} {'took':>6}  checks")
        for s in self.steps:
            lines.append(
                f"{s.number:>4}  {s.fault:<13} {s.target:<15} {s.seconds:>5.1f} {s.submitted:>4} "
                f"{s.took_s:>5.1f}s  {s.checks}"
            )
        faults = Counter(s.fault for s in self.steps)
        lines += ["", "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))]
        right = Counter((j.expected, self.final.get(j.job_id, "?")) for j in self.jobs.values())
        lines.append(
            "jobs (expected -> ended): " + ", ".join(f"{e}->{g} {n}" for (e, g), n in sorted(right.items()))
        )
        lines.append(
            f"poison messages {len(self.poison_seqs)} (all quarantined, nothing else), forged binds "
            f"{len(self.forged_seqs)}"
        )
        lines.append(f"audit: {self.audit}")
        lines.append("result: " + ("ok" if self.ok else "FAILED\n  " + "\n  ".join(self.failures)))
        return "\n".join(lines)


class Monkey:
    def __init__(self, cluster: LocalCluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        # every service instance the cluster runs (agents and servers are faults of their own)
        self.services = sorted(name for name in cluster.processes if not name.startswith("agent-"))
        self.replicated = len(cluster.nats_cluster) > 1
        self._round: list[str] = []  # the replicated run's faults still to come in this round
        self.result = ChaosResult(seed=seed)
        self.to_cancel: list[str] = []
        self.count = 0
        # ranks run as an unprivileged user: the tenant's script and reports live where it can reach them
        self.shared = Path(tempfile.mkdtemp(prefix="rally-chaos-tenant-"))
        self.shared.chmod(0o777)
        shutil.copyfile(ATTACK, self.shared / ATTACK.name)
        self.tenant_reports: dict[int, Path] = {}

    # -- the trickle of jobs ----------------------------------------------------------------------

    def submit_some(self, step: int) -> int:
        submitted = 0
        kinds, weights = ("ok", "fails", "cancel", "gang"), (6, 2, 1, 2 if self.replicated else 0)
        for _ in range(self.rng.randint(1, 3)):
            kind = self.rng.choices(kinds, weights=weights)[0]
            if self._submit(step, kind) is not None:
                submitted += 1
        return submitted

    def _submit(self, step: int, kind: str) -> str | None:
        self.count += 1
        name = f"chaos-{self.count}-{kind}"
        gpus = 16 if kind == "gang" else self.rng.choice((1, 1, 2, 4, 8))
        command = {
            "ok": ["sleep", f"{self.rng.uniform(0.5, 3):.1f}"],
            "fails": ["sh", "-c", "sleep 0.5; exit 3"],
            "cancel": ["sleep", "600"],
            "gang": ["sleep", f"{self.rng.uniform(8, 15):.1f}"],
        }[kind]
        per_task = 8 if kind == "gang" else gpus
        body = {"name": name, "team": "chaos", "gpus": gpus, "gpus_per_task": per_task, "ranks_per_task": 1}
        body["command"] = command
        answer = _post_until_acknowledged(self.cluster.api_url, body, key=name, within_s=30)
        if answer is None:
            return None  # never acknowledged: the client knows it must retry; not ours to track
        expected = {"ok": "completed", "fails": "failed", "cancel": "cancelled", "gang": "completed"}[kind]
        self.result.jobs[answer] = Submitted(job_id=answer, kind=kind, expected=expected, step=step)
        if kind == "cancel":
            self.to_cancel.append(answer)
        return answer

    def submit_tenant(self, step: int) -> None:
        """A job of team nlp attacking the newest chaos job and one node (``tests/e2e/tenant_attack.py``)."""
        assert self.cluster.nats is not None
        victim = max(self.result.jobs, key=lambda j: self.result.jobs[j].step, default="chaos-none")
        nodes = self.cluster.node_ids()
        report = self.shared / f"tenant-{step}.json"
        command = [sys.executable, str(self.shared / ATTACK.name), str(report)]
        command += [self.cluster.nats.url.removeprefix("nats://"), self.cluster.api_url, victim]
        command += [nodes[step % len(nodes)], str(self.shared)]
        token = self.cluster.token_for(TENANT_TEAM)
        body = {
            "name": f"tenant-{step}",
            "team": TENANT_TEAM,
            "gpus": 1,
            "gpus_per_task": 1,
            "command": command,
        }
        body["env"] = {"TEAM_TOKEN": token}
        answer = _post_until_acknowledged(
            self.cluster.api_url, body, key=f"tenant-{step}", within_s=30, token=token
        )
        if answer is not None:
            self.result.jobs[answer] = Submitted(
                job_id=answer, kind="tenant", expected="completed", step=step
            )
            self.tenant_reports[step] = report

    def tenant_problems(self) -> list[str]:
        """What a tenant's job got that it must not have: a bus identity, or another team's job."""
        problems = []
        for step, path in sorted(self.tenant_reports.items()):
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError):
                problems.append(f"tenant of step {step} wrote no report")
                continue
            # a server that let it in says +OK (verbose) and PONG; one that was down meanwhile said nothing
            accepted = [a["user"] for a in report["nats"] if "+OK" in a["answer"] or "PONG" in a["answer"]]
            if accepted:
                problems.append(f"tenant of step {step}: NATS did not refuse {accepted}")
            if report["http"]["cancel_victim"] in (200, 202):
                problems.append(f"tenant of step {step} cancelled another team's job")
        return problems

    def cancel_pending(self) -> None:
        for job_id in self.to_cancel:
            _retry(
                lambda j=job_id: call("DELETE", f"{self.cluster.api_url}/v1/jobs/{j}")[0] in (202, 200, 409)
            )
        self.to_cancel = []

    # -- faults -----------------------------------------------------------------------------------

    def _kind(self) -> str:
        if not self.replicated:
            return self.rng.choice(FAULTS)
        if not self._round:
            self._round = self.rng.sample(REPLICATED_FAULTS, len(REPLICATED_FAULTS))
        return self._round.pop()

    def fault(self) -> tuple[str, str, float]:
        kind = self._kind()
        nodes = self.cluster.node_ids()
        if kind == "kill-service":
            target = self.rng.choice(self.services)
            self.cluster.kill(target)
            return kind, target, 0.0
        if kind == "kill-service+nats":
            target = self.rng.choice(self.services)
            server, pid = self._nats_victim()
            self.cluster.kill(target)
            os.kill(pid, signal.SIGKILL)
            return kind, f"{target}+{server}", 0.0
        if kind == "stop-service":
            target, seconds = self.rng.choice(self.services), self.rng.uniform(1, 6)
            _pause(self.cluster.processes[target].pid, seconds)
            return kind, target, seconds
        if kind == "kill-agent":
            target = f"agent-{self.rng.choice(nodes)}"
            self.cluster.kill(target)
            return kind, target, 0.0
        if kind == "freeze-node":
            target, seconds = self.rng.choice(nodes), self.rng.uniform(2, 14)  # past 8 s: the node is lost
            self.cluster.freeze_node(target, signal.SIGSTOP)
            time.sleep(seconds)
            self.cluster.freeze_node(target, signal.SIGCONT)
            return kind, target, seconds
        if kind == "poison":
            data = self.rng.choice(POISON)
            target = f"rally.job.chaos-{self.rng.randrange(10**6)}"
            self.result.poison_seqs.append(self._publish(lambda log: log.js.publish(target, data)))
            return kind, target.removeprefix("rally.job."), 0.0
        if kind == "forge":
            job_id = self.rng.choice(sorted(self.result.jobs)) if self.result.jobs else "chaos-none"
            node = self.rng.choice(nodes)
            self.result.forged_seqs.append(self._publish(lambda log: _forge(log, job_id, node)))
            return kind, job_id, 0.0
        server, pid = self._nats_victim()
        os.kill(pid, signal.SIGKILL)
        return kind, server, 0.0

    def _nats_victim(self) -> tuple[str, int]:
        """One of our nats-servers, drawn from the seed: its name and pid."""
        name, server = self.rng.choice(self.cluster.nats_names())
        assert server.pid is not None
        return name, server.pid

    def _publish(self, write: Any) -> int:
        """``write(log)`` as the admin identity, retried while nats-server comes back; its sequence."""

        async def once() -> int:
            log = await EventLog.connect(self.cluster.nats_url, name="chaos-monkey", create=False)
            try:
                answer = await write(log)
                return int(answer if isinstance(answer, int) else answer.seq)
            finally:
                await log.close()

        deadline = time.monotonic() + 60
        while True:
            self.cluster.supervise()
            try:
                return asyncio.run(once())
            except (OSError, EventLogError, RuntimeError):  # a timeout is an OSError
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    # -- one step, and the checks after it ----------------------------------------------------------

    def step(self, number: int) -> Step:
        began = time.monotonic()
        submitted = self.submit_some(number)
        if number % TENANT_EVERY == 1:
            self.submit_tenant(number)
        self.cancel_pending()
        fault, target, seconds = self.fault()
        self.supervise(2.0)
        step = Step(number=number, fault=fault, target=target, seconds=seconds, submitted=submitted)
        step.checks = self.check(number)
        step.took_s = time.monotonic() - began
        return step

    def supervise(self, seconds: float) -> None:
        """Let the supervisor bring back what died, as `rally up` does once a second."""
        deadline = time.monotonic() + seconds
        while True:
            self.cluster.supervise()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)

    def check(self, number: int) -> str:
        problems = _retry_check(lambda: self._check_once(), within_s=40, supervise=self.cluster.supervise)
        for problem in problems:
            self.result.failures.append(f"step {number}: {problem}")
        return "ok" if not problems else "; ".join(problems)

    def _check_once(self, *, projector_caught_up: bool = False) -> list[str]:
        live = call("GET", f"{self.cluster.api_url}/v1/state")[1]
        live_seq = int(live["seq"])
        position, projected = asyncio.run(_projection(self.cluster.postgres_dsn))
        history = asyncio.run(read_history(self.cluster.nats_url, max(live_seq, position)))
        state = _fold_to(history, live_seq)
        problems = []
        if state.hash() != live["hash"]:
            problems.append(f"replay hash differs from the live hash at seq {live_seq}")
        lost = [j for j in self.result.jobs if j not in state.jobs]
        problems += [f"acknowledged job {j} is not in the log" for j in lost]
        problems += _double_bound(state)
        problems += _double_actions(history, live_seq)
        problems += self._quarantine_problems(history, live_seq)
        if projector_caught_up and position < live_seq:
            problems.append(f"the projector is at seq {position}, the log at {live_seq}")
        at_position = {j.job_id: j.state for j in _fold_to(history, position).jobs.values()}
        if projected != at_position:
            differ = sorted(
                j for j in set(projected) | set(at_position) if projected.get(j) != at_position.get(j)
            )
            problems.append(f"PostgreSQL at seq {position} differs from the log for jobs {differ[:5]}")
        return problems

    def _quarantine_problems(self, history: History, to_seq: int) -> list[str]:
        quarantined = {seq for seq, item in history if isinstance(item, Quarantined) and seq <= to_seq}
        published = {seq for seq in self.result.poison_seqs if seq <= to_seq}
        if quarantined == published:
            return []
        return [f"quarantined seqs {sorted(quarantined)}, poison published at {sorted(published)}"]

    def drain(self, timeout: float) -> None:
        """Until every acknowledged job is terminal; then compare with what each should have become."""
        self.cancel_pending()
        deadline = time.monotonic() + timeout
        pending = set(self.result.jobs)
        while pending and time.monotonic() < deadline:
            self.cluster.supervise()
            for job_id in sorted(pending):
                with contextlib.suppress(OSError):
                    status, view = call("GET", f"{self.cluster.api_url}/v1/jobs/{job_id}")
                    if status == 200 and view["state"] in TERMINAL:
                        self.result.final[job_id] = view["state"]
                        pending.discard(job_id)
            time.sleep(0.5)
        for job in self.result.jobs.values():
            ended = self.result.final.get(job.job_id, "not ended")
            if ended != job.expected:
                self.result.failures.append(
                    f"{job.job_id} ({job.kind}) ended {ended}, expected {job.expected}"
                )
        self.result.failures += [f"after the run: {p}" for p in self.check_final()]
        self.result.failures += self.tenant_problems()

    def check_final(self) -> list[str]:
        problems = _retry_check(
            lambda: self._check_once(projector_caught_up=True), within_s=60, supervise=self.cluster.supervise
        )
        return problems + self.audit()

    def audit(self) -> list[str]:
        """The whole log through the audit: every decision recomputed identically, only the forged refused."""
        history = asyncio.run(read_history(self.cluster.nats_url, None))
        report = verify_decisions(history, POLICY, repair_wait_s=REPAIR_WAIT_S)
        refused = sorted(r.seq for r in report.refused)
        self.result.audit = (
            f"{report.decisions} decisions, {report.verified} recomputed identically, "
            f"{report.repairs_verified} of {report.repairs} repairs, "
            f"{len(report.mismatches)} differ, {report.other_policy} under another policy, "
            f"refused seqs {refused}"
        )
        problems = [f"audit: seq {m.seq} {m.kind} {m.job_id} recorded {m.recorded}, recomputed "
                    f"{m.recomputed}" for m in report.mismatches]  # fmt: skip
        if report.other_policy:
            problems.append(f"audit: {report.other_policy} decisions under another policy")
        problems += [f"audit: not its writer's: {t.describe()}" for t in report.trespasses]
        if refused != sorted(self.result.forged_seqs):
            problems.append(
                f"audit refused {refused}, the forged binds are {sorted(self.result.forged_seqs)}"
            )
        return problems


def _fold_to(history: History, seq: int) -> ClusterState:
    state = ClusterState()
    for at, item in history:
        if at > seq:
            break
        state.apply_stored(at, item)
    return state


async def _projection(dsn: str) -> tuple[int, dict[str, str]]:
    """The projector's position and its jobs' states, read in one snapshot."""
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            position = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM rally.projection_position")
            rows = await conn.fetch("SELECT job_id, state FROM rally.jobs")
    finally:
        await conn.close()
    return int(position), {r["job_id"]: r["state"] for r in rows}


async def _forge(log: EventLog, job_id: str, node_id: str) -> int:
    """A bind that looks like the scheduler's (its policy, a plausible position) but was never its leader's:
    epoch 0, appended raw without the fencing headers."""
    now = time.time()
    bind = GangBound(
        job_id=job_id,
        attempt=1,
        epoch=0,
        placements=(TaskPlacement(task=0, node_id=node_id, gpus=(0,)),),
        computed_at_seq=await log.last_seq(),
        policy_version=POLICY.version,
        now=now,
        at=now,
    )
    return await log.append(
        subjects.bind(job_id), bind, msg_id=f"chaos-forged:{job_id}:{now}", source="rallypoint/scheduler"
    )


def _pause(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def _double_actions(history: History, to_seq: int) -> list[str]:
    """What two replicas sharing work would write twice: a second JobStarted for one attempt, a second end
    of one job, a second verification of one checkpoint step."""
    seen: Counter[tuple[str, ...]] = Counter()
    for seq, item in history:
        if seq > to_seq:
            break
        if isinstance(item, JobStarted):
            seen[("JobStarted", item.job_id, str(item.attempt))] += 1
        elif isinstance(item, ENDS):
            seen[("end", item.job_id)] += 1
        elif isinstance(item, CheckpointVerified):
            seen[("CheckpointVerified", item.job_id, str(item.step))] += 1
    return [f"written {n} times: {' '.join(key)}" for key, n in sorted(seen.items()) if n > 1]


def _double_bound(state: ClusterState) -> list[str]:
    """GPUs held by two active jobs, or held by a job the node does not say holds it."""
    owner: dict[tuple[str, int], str] = {}
    problems = []
    for job in state.jobs.values():
        if job.state not in ACTIVE:
            continue
        for placement in job.placements:
            for gpu in placement.gpus:
                key = (placement.node_id, gpu)
                if key in owner:
                    problems.append(
                        f"GPU {gpu} of {placement.node_id} bound to {owner[key]} and {job.job_id}"
                    )
                owner[key] = job.job_id
    for node in state.nodes.values():
        for gpu, job_id in node.allocated.items():
            if owner.get((node.node_id, gpu)) != job_id:
                problems.append(f"GPU {gpu} of {node.node_id} allocated to {job_id}, not an active placement")
    return problems


def _post_until_acknowledged(
    api: str, body: dict[str, Any], *, key: str, within_s: float, token: str | None = None
) -> str | None:
    """A CI client: retry a 503 or a refused connection with the same Idempotency-Key; the job id once 202.
    As the admin, or as ``token``'s team."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            headers = {"Idempotency-Key": key}
            status, answer = call("POST", f"{api}/v1/jobs", body, headers=headers, token=token)
            if status == 202:
                return str(answer["job_id"])
            if status not in (503, 504):
                raise AssertionError(f"submission refused: {status} {answer}")
        time.sleep(0.5)
    return None


def _retry(attempt: Any, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, KeyError):
            if attempt():
                return
        time.sleep(0.5)


def _retry_check(check: Any, *, within_s: float, supervise: Any) -> list[str]:
    """The checks once the cluster answers: unreachable parts are retried (they are being restarted), a
    wrong answer is retried too (the API may serve an older fold than the log for a moment)."""
    deadline = time.monotonic() + within_s
    problems = ["the API or the log did not answer"]
    while time.monotonic() < deadline:
        supervise()
        with contextlib.suppress(
            OSError, KeyError, TypeError, ValueError, RuntimeError, EventLogError, asyncpg.PostgresError
        ):
            problems = check()
            if not problems:
                return []
        time.sleep(0.5)
    return problems


def run_chaos(
    workdir: Path,
    *,
    seed: int,
    steps: int,
    minutes: float | None = None,
    drain_s: float = 120.0,
    nats_servers: int = 1,
    replicas: int = 1,
) -> ChaosResult:
    """``steps`` steps, or as many as ``minutes`` allow when it is given; on ``nats_servers`` servers with
    ``replicas`` of every service (the scheduler at least a leader and a standby)."""
    began = time.monotonic()
    counts = {service: replicas for service in REPLICATED} if replicas > 1 else {}
    with LocalCluster(
        workdir, nodes=4, gpus_per_node=8, racks=2, nats_servers=nats_servers, replicas=counts
    ) as cluster:
        monkey = Monkey(cluster, seed)
        number = 0
        while _more(number, steps, minutes, time.monotonic() - began):
            number += 1
            monkey.result.steps.append(monkey.step(number))
        monkey.drain(drain_s)
        monkey.result.elapsed_s = time.monotonic() - began
        shutil.rmtree(monkey.shared, ignore_errors=True)
        return monkey.result


def _more(done: int, steps: int, minutes: float | None, elapsed_s: float) -> bool:
    return elapsed_s < minutes * 60 if minutes is not None else done < steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.monkey", description=__doc__)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--minutes", type=float, help="run steps for this long instead of --steps")
    parser.add_argument("--drain", type=float, default=180.0, help="seconds for every job to end")
    parser.add_argument(
        "--nats-servers", type=int, choices=(1, 3), default=1, help="a JetStream cluster of 3"
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas of every service (default 1)")
    args = parser.parse_args(argv)
    # The checks reconnect to a server that is being killed on purpose: its warnings are expected.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(message)s")
    # Every check replays the whole log, so each poison message would be logged again at every step: the
    # summary lists them once.
    logging.getLogger("rallypoint.eventlog").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="rally-chaos-"))
    result = run_chaos(
        workdir,
        seed=args.seed,
        steps=args.steps,
        minutes=args.minutes,
        drain_s=args.drain,
        nats_servers=args.nats_servers,
        replicas=args.replicas,
    )
    print(result.table())
    if not result.ok:
        print(f"the cluster's logs are kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
