"""A seeded chaos run on a real local cluster: `python -m tests.chaos.monkey --steps 40 --seed 7`.

Each step submits a trickle of jobs (short ones that succeed, ones that fail, long ones cancelled a step
later), then does one fault drawn from the seed: kill -9 or SIGSTOP of a service, kill -9 of an agent, a
frozen node (its agent and ranks, sometimes past the lost timeout), kill -9 of nats-server. Whatever dies is
brought back by the cluster's supervisor (``LocalCluster.supervise``, as `rally up` does). After every step:

- no acknowledged job is lost (every 202's job id is known to the API and to the log);
- no GPU is bound twice (the active jobs' placements in a fresh fold of the log never overlap);
- the state hash the API serves equals a fresh replay's to the same sequence.

At the end every job must reach its right final state (completed / failed / cancelled). ``make chaos`` runs
it long with a summary table; ``tests/chaos/test_chaos_short.py`` runs a short one in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.cli.replay import fold, read_history
from rallypoint.eventlog import EventLogError
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.localcluster.supervisor import SCHEDULERS, SINGLETONS
from rallypoint.state import ACTIVE, ClusterState

TERMINAL = {"completed", "failed", "cancelled", "rejected"}
#: Every service the local cluster runs (agents and servers are faults of their own).
SERVICES = ("api", *SINGLETONS, *SCHEDULERS)
FAULTS = ("kill-service", "stop-service", "kill-agent", "freeze-node", "kill-nats")


@dataclass
class Submitted:
    job_id: str
    kind: str  # "ok", "fails" or "cancel"
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

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        lines = [f"chaos seed {self.seed}: {len(self.steps)} steps, {len(self.jobs)} jobs acknowledged", ""]
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
        lines.append("result: " + ("ok" if self.ok else "FAILED\n  " + "\n  ".join(self.failures)))
        return "\n".join(lines)


class Monkey:
    def __init__(self, cluster: LocalCluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.result = ChaosResult(seed=seed)
        self.to_cancel: list[str] = []
        self.count = 0

    # -- the trickle of jobs ----------------------------------------------------------------------

    def submit_some(self, step: int) -> int:
        submitted = 0
        for _ in range(self.rng.randint(1, 3)):
            kind = self.rng.choices(("ok", "fails", "cancel"), weights=(6, 2, 1))[0]
            if self._submit(step, kind) is not None:
                submitted += 1
        return submitted

    def _submit(self, step: int, kind: str) -> str | None:
        self.count += 1
        name = f"chaos-{self.count}-{kind}"
        gpus = self.rng.choice((1, 1, 2, 4, 8))
        command = {
            "ok": ["sleep", f"{self.rng.uniform(0.5, 3):.1f}"],
            "fails": ["sh", "-c", "sleep 0.5; exit 3"],
            "cancel": ["sleep", "600"],
        }[kind]
        body = {"name": name, "team": "chaos", "gpus": gpus, "gpus_per_task": gpus, "ranks_per_task": 1}
        body["command"] = command
        answer = _post_until_acknowledged(self.cluster.api_url, body, key=name, within_s=30)
        if answer is None:
            return None  # never acknowledged: the client knows it must retry; not ours to track
        expected = {"ok": "completed", "fails": "failed", "cancel": "cancelled"}[kind]
        self.result.jobs[answer] = Submitted(job_id=answer, kind=kind, expected=expected, step=step)
        if kind == "cancel":
            self.to_cancel.append(answer)
        return answer

    def cancel_pending(self) -> None:
        for job_id in self.to_cancel:
            _retry(
                lambda j=job_id: call("DELETE", f"{self.cluster.api_url}/v1/jobs/{j}")[0] in (202, 200, 409)
            )
        self.to_cancel = []

    # -- faults -----------------------------------------------------------------------------------

    def fault(self) -> tuple[str, str, float]:
        kind = self.rng.choice(FAULTS)
        nodes = self.cluster.node_ids()
        if kind == "kill-service":
            target = self.rng.choice(SERVICES)
            self.cluster.kill(target)
            return kind, target, 0.0
        if kind == "stop-service":
            target, seconds = self.rng.choice(SERVICES), self.rng.uniform(1, 6)
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
        assert self.cluster.nats is not None and self.cluster.nats.pid is not None
        os.kill(self.cluster.nats.pid, signal.SIGKILL)
        return kind, "nats-server", 0.0

    # -- one step, and the checks after it ----------------------------------------------------------

    def step(self, number: int) -> Step:
        began = time.monotonic()
        submitted = self.submit_some(number)
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

    def _check_once(self) -> list[str]:
        live = call("GET", f"{self.cluster.api_url}/v1/state")[1]
        state = fold(asyncio.run(read_history(self.cluster.nats_url, int(live["seq"]))))
        problems = []
        if state.hash() != live["hash"]:
            problems.append(f"replay hash differs from the live hash at seq {live['seq']}")
        lost = [j for j in self.result.jobs if j not in state.jobs]
        problems += [f"acknowledged job {j} is not in the log" for j in lost]
        problems += _double_bound(state)
        return problems

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

    def check_final(self) -> list[str]:
        return _retry_check(lambda: self._check_once(), within_s=40, supervise=self.cluster.supervise)


def _pause(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


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


def _post_until_acknowledged(api: str, body: dict[str, Any], *, key: str, within_s: float) -> str | None:
    """A CI client: retry a 503 or a refused connection with the same Idempotency-Key; the job id once 202."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            status, answer = call("POST", f"{api}/v1/jobs", body, headers={"Idempotency-Key": key})
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
        with contextlib.suppress(OSError, KeyError, TypeError, ValueError, RuntimeError, EventLogError):
            problems = check()
            if not problems:
                return []
        time.sleep(0.5)
    return problems


def run_chaos(workdir: Path, *, seed: int, steps: int, drain_s: float = 120.0) -> ChaosResult:
    with LocalCluster(workdir, nodes=4, gpus_per_node=8, racks=2) as cluster:
        monkey = Monkey(cluster, seed)
        for number in range(1, steps + 1):
            monkey.result.steps.append(monkey.step(number))
        monkey.drain(drain_s)
        return monkey.result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.monkey", description=__doc__)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--drain", type=float, default=180.0, help="seconds for every job to end")
    args = parser.parse_args(argv)
    # The checks reconnect to a server that is being killed on purpose: its warnings are expected.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(message)s")
    result = run_chaos(
        Path(tempfile.mkdtemp(prefix="rally-chaos-")), seed=args.seed, steps=args.steps, drain_s=args.drain
    )
    print(result.table())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
