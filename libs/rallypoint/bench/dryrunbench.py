"""``rally bench dryrun``: the latency of dry runs (``POST /v1/jobs?dry_run=true``) on a large, busy fold.

Issue 33 asks a dry run's p95 <= 1 s with 10,000 pending jobs on 12,500 nodes. The workload is
``rally bench scheduler``'s (``corebench.build_workload``: racks of 32 nodes, ~80% of the GPUs held by
running gangs, ``--pending`` jobs of a heavy-tailed size mix over 20 teams in 4 orgs with quotas), written
as events (nodes registered, each running gang submitted and bound, each waiting job submitted) into the
log of an embedded nats-server, and folded by the real API (``build_app``: the queue file's quotas, a
team's token) served by aiohttp on a real port. The driver then sends ``--runs`` dry runs one after the
other, in turn a 1-GPU job, a one-node job, a 64-GPU gang and a 1,024-GPU gang, and times each answer.
The first is reported apart (``first_ms``: it builds the scheduler's model of the fold, which later ones
keep in step). Every answer is one cycle of the real core over all the pending jobs plus the dry run's:
where nothing has bound the waiting jobs (the workload's), that cycle binds thousands of them too, so
this is the dry run's worst case. Those answers carry no prediction (no predictor runs: ``unavailable``).
Then the predictor service's query handlers (``answer_queries``) are served on the same NATS server over
the API's fold, and a quarter of ``--runs`` more dry runs (at least two of each shape) are timed with their
predicted start (``with_prediction``: the API's latency, the predictor's own time per dry run, how many
answers said ``now``, ``predicted``, ``beyond-horizon`` or ``unavailable``, and the same per shape); no
periodic refresh runs, and each dry run waits until the predictor finished the last one and made the
next one's fork ahead (``ready_forks``: how many ran from such a fork). ``with_forecast``: the same
again after one refresh of the predictor (``refresh_s``; minutes at the default size), so that a dry run
whose own run forward is not done within ``DRY_RUN_EXACT_S`` is fitted into the refresh's forecast
(``estimated``, ``predict.profile``), and again while the predictor's next refresh runs beside them
(``with_forecast.during_refresh``). ``appended`` is how far the log moved over all the dry runs: 0.

``--exact-budget S`` gives their own runs forward another share of it than ``DRY_RUN_EXACT_S`` (0: every
dry run after the refresh is fitted into its forecast). ``--predictor-budget S`` gives the predictor's dry
runs another budget than the service's
(``DRY_RUN_BUDGET_S``): with a large one, ``with_prediction.predictor`` is how long a prediction takes
(the API still answers ``unavailable`` after its 2 s).

``rally bench dryrun --nodes 12500 --pending 10000 --json`` (``cli/bench.py`` holds its arguments).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.app import FOLLOWER
from rallypoint_services.api.fold import FoldFollower
from rallypoint_services.predictor.service import answer_queries, settings_reader
from rallypoint_services.scheduler.leader import scheduler_settings

from rallypoint.core import (
    ClusterModel,
    PendingJob,
    RunningJob,
    Snapshot,
    TaskPlacement,
    policy_by_name,
    schedule,
)
from rallypoint.eventlog import Append, EventLog, connect_nats
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import (
    Event,
    GangBound,
    GpuInfo,
    JobSpec,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    subjects,
)
from rallypoint.infra import NatsServer, free_port
from rallypoint.predict.live import PredictedStart
from rallypoint.predict.refresh import DRY_RUN_BUDGET_S, DRY_RUN_EXACT_S, Predictor
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import Org, Queues, Team
from rallypoint.security.tokens import TokenStore, create_token

from .corebench import build_workload

TEAM = "team00"
BATCH = 1000
FOLD_TIMEOUT_S = 600.0
#: What the driver asks, in turn: GPUs and GPUs per task.
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (8, 8), (64, 8), (1024, 8))
#: The statuses of a dry run's ``predicted_start`` the bench counts.
STATUSES = ("now", "predicted", "estimated", "beyond-horizon", "unavailable")


def _node_event(node_id: str, rack: str, spine: str, gpu_type: str, gpus: int) -> NodeRegistered:
    board = tuple(GpuInfo(index=g, uuid=f"{node_id}-{g}", memory_mib=1, nvlink_domain=0) for g in range(gpus))
    return NodeRegistered(
        node_id=node_id, address="127.0.0.1", rack=rack, spine=spine, gpu_type=gpu_type, gpus=board,
        cpu_milli=192_000, memory_mib=2 << 20, agent_instance="dryrunbench", at=1.0,
    )  # fmt: skip


def _job_spec(job: RunningJob | PendingJob, limit: float | None) -> JobSpec:
    per_task = job.gpus_per_task or job.gpus
    return JobSpec(
        name=job.id, team=job.team, gpus=job.gpus, gpus_per_task=per_task, ranks_per_task=1,
        command=("true",), priority=job.priority_class, time_limit_s=None if limit is None else int(limit),
    )  # fmt: skip


def settled_workload(
    nodes: int, pending: int, seed: int, queues: Queues, *, rounds: int = 8
) -> tuple[ClusterModel, tuple[PendingJob, ...], float]:
    """``build_workload``'s cluster once the scheduler has done what it can: twice ``pending`` jobs
    arrive, cycles of the core bind what fits (until one binds nothing, at most ``rounds``), and the first
    ``pending`` of those still waiting stay. The cycles decide under ``queues`` (the queue file the log's
    settings carry, its quotas and priority classes), as the leader would: a live queue of that length is
    made of jobs the last cycle could not place, so a dry run's cycle places at most the dry job, not
    thousands. The workload's clock (``now``) comes third."""
    cluster, waiting, _, now = build_workload(nodes, 8, 2 * pending, seed)
    core, classes = core_queues(queues)
    policy = policy_by_name("rallypoint")
    for _ in range(rounds):
        snapshot = Snapshot(now=now, cluster=cluster, pending=waiting, queues=core, priority_classes=classes)
        decisions = schedule(snapshot, policy)
        if not decisions.binds:
            break
        jobs = {j.id: j for j in waiting}
        for bind in decisions.binds:
            cluster.bind(_started(jobs.pop(bind.job_id), bind.placements, now))
        waiting = tuple(jobs.values())
    return cluster, waiting[:pending], now


def _started(job: PendingJob, placements: tuple[TaskPlacement, ...], now: float) -> RunningJob:
    return RunningJob(
        id=job.id, team=job.team, priority_class=job.priority_class, gpus=job.gpus,
        gpus_per_task=job.gpus_per_task, placements=placements, start_time=now,
        expected_end=None if job.time_limit_s is None else now + job.time_limit_s,
        submit_time=job.submit_time,
    )  # fmt: skip


def workload_events(
    cluster: ClusterModel, waiting: Sequence[PendingJob], queues: Queues, *, shift: float = 0.0
) -> Iterator[Event]:
    """The workload as the log would hold it: a scheduler epoch and the settings its leader decides with
    (``queues``' quotas: what the predictor reads), the nodes, each running gang submitted and bound (in
    that epoch), each waiting job submitted. ``shift`` is added to the workload's times: the bench moves
    its clock (``settled_workload``'s ``now``) to the wall clock's, which dry runs are judged at, so the
    running gangs are as far from their ends as the workload says."""
    yield LeaderEpochStarted(epoch=1, leader_id="dryrunbench", role="scheduler", at=1.0)
    core, classes = core_queues(queues)
    yield scheduler_settings(
        SchedulingPolicy(queues=core, priority_classes=classes),
        epoch=1,
        leader_id="dryrunbench",
        queue_file="dryrunbench",
        repair_wait_s=0.0,
        at=1.0,
    )
    for node in cluster.nodes.values():
        yield _node_event(node.id, node.rack, node.spine, node.gpu_type, node.gpus)
    for run in sorted(cluster.running.values(), key=lambda j: j.id):
        limit = None if run.expected_end is None else run.expected_end - run.start_time
        began = run.start_time + shift
        yield JobSubmitted(job_id=run.id, spec=_job_spec(run, limit), submitted_at=began)
        yield GangBound(
            job_id=run.id, attempt=1, epoch=1, placements=run.placements, computed_at_seq=1,
            policy_version="dryrunbench", now=began, at=began,
        )  # fmt: skip
    for job in waiting:
        spec = _job_spec(job, job.time_limit_s)
        yield JobSubmitted(job_id=job.id, spec=spec, submitted_at=job.submit_time + shift)


async def _append_all(log: EventLog, events: Iterator[Event]) -> int:
    batch: list[Append] = []
    count = 0
    for event in events:
        count += 1
        batch.append(Append(subjects.for_event(event), event, f"dryrunbench:{count}"))
        if len(batch) == BATCH:
            await log.append_batch(batch, source="rallypoint/dryrunbench")
            batch = []
    if batch:
        await log.append_batch(batch, source="rallypoint/dryrunbench")
    return count


def bench_queues(teams: int = 20, orgs: int = 4, total_gpus: int = 100_000) -> Queues:
    """``build_workload``'s queues as a queue file: 20 teams in 4 orgs, an equal nominal share each."""
    return Queues(
        orgs=[Org(name=f"org{o}") for o in range(orgs)],
        teams=[
            Team(name=f"team{t:02d}", parent=f"org{t % orgs}", nominal=total_gpus // teams)
            for t in range(teams)
        ],
    )


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class _TimedPredictor(Predictor):
    """The predictor service's ``Predictor``, noting how long each dry run's prediction took (``took``,
    seconds, also those the API stopped waiting for) so that the driver can wait for it to be idle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.took: list[float] = []
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def dry_run(
        self, spec: JobSpec, now: float | None = None, *, jobs_ahead: int | None = None
    ) -> PredictedStart:
        self._busy += 1
        self._idle.clear()
        start = time.perf_counter()
        try:
            return await super().dry_run(spec, now, jobs_ahead=jobs_ahead)
        finally:
            self.took.append(time.perf_counter() - start)
            self._busy -= 1
            if not self._busy:
                self._idle.set()

    async def idle(self) -> None:
        """Until no dry run is under way and the next one's fork is made (``Predictor.prepare``)."""
        await self._idle.wait()
        await self.preparing()


async def _time_dry_runs(
    url: str, token: str, runs: int, predictor: _TimedPredictor | None = None
) -> tuple[list[float], list[dict[str, Any]]]:
    """Seconds per dry run, one after the other, and the answers. With ``predictor``, each waits until
    the predictor finished the last one's prediction (one the API stopped waiting for runs on)."""
    headers = {"Authorization": f"Bearer {token}"}
    took: list[float] = []
    answers: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(headers=headers) as session:
        for i in range(runs):
            if predictor is not None:
                await predictor.idle()
            gpus, per_task = SHAPES[i % len(SHAPES)]
            body = {"name": f"dry{i}", "gpus": gpus, "gpus_per_task": per_task, "command": ["true"]}
            start = time.perf_counter()
            async with session.post(f"{url}/v1/jobs", params={"dry_run": "true"}, json=body) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"dry run answered {resp.status}: {answer}")
            took.append(time.perf_counter() - start)
            answers.append(answer)
        if predictor is not None:
            await predictor.idle()
    return took, answers


async def _wait_folded(follower: FoldFollower, seq: int) -> float:
    """Seconds until the API's fold has replayed the log to ``seq`` (its first read would wait for it)."""
    start = time.perf_counter()
    if not await follower.wait_for_seq(seq, FOLD_TIMEOUT_S):
        raise TimeoutError(f"the API's fold did not reach seq {seq} in {FOLD_TIMEOUT_S:.0f} s")
    return time.perf_counter() - start


def _latency(seconds: Sequence[float]) -> dict[str, float]:
    ms = [t * 1000 for t in seconds]
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(_percentile(ms, 0.95), 1),
        "max_ms": round(max(ms), 1),
    }


def _predicted_runs(runs: int) -> int:
    """Dry runs timed with the predictor: a quarter of ``--runs`` (each is a run forward of its own, up
    to seconds at the default size), at least two of each shape."""
    return max(2 * len(SHAPES), runs // 4)


async def _with_prediction(
    log: EventLog,
    app: web.Application,
    url: str,
    token: str,
    runs: int,
    budget_s: float,
    *,
    exact_s: float,
    refresh: bool,
) -> dict[str, Any]:
    """The same dry runs with the predictor service's query handlers (``answer_queries``) on the same NATS
    server, over the API's fold, so each answer carries the predictor's run forward (``predicted_start``).
    No periodic refresh runs beside them (the log does not move): each dry run is timed alone. ``refresh``:
    one refresh first (``refresh_s``), so that a dry run whose own run forward takes longer than
    ``DRY_RUN_EXACT_S`` is fitted into its forecast (``estimated``); without it, that run has the whole
    budget."""
    predictor = _TimedPredictor(
        lambda: app[FOLLOWER].state, settings_reader(log), dry_run_budget_s=budget_s, dry_run_exact_s=exact_s
    )
    refreshed: dict[str, Any] = {}
    if refresh:
        began = time.perf_counter()
        found = await predictor.refresh()
        refreshed = {
            "refresh_s": round(time.perf_counter() - began, 1),
            "refresh_predicted": sum(start.p50 is not None for start in found.jobs.values()),
        }
    subscriptions = await answer_queries(log.nc, predictor)
    try:
        took, answers = await _time_dry_runs(url, token, runs, predictor)
        own = list(predictor.took)  # the predictor's time for these, not those during the refresh below
        if refresh:
            refreshed["during_refresh"] = await _during_refresh(predictor, url, token, runs)
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()
    statuses = [(a["predicted_start"] or {}).get("status", "none") for a in answers]
    by_shape: dict[str, dict[str, Any]] = {}
    for i, (seconds, answer, status) in enumerate(zip(took, answers, statuses, strict=True)):
        gpus, _ = SHAPES[i % len(SHAPES)]
        row = by_shape.setdefault(f"{gpus}_gpus", {"ms": [], "statuses": {}})
        row["ms"].append(round(seconds * 1000, 1))
        row["statuses"][status] = row["statuses"].get(status, 0) + 1
        if status in ("predicted", "estimated"):
            row["p50_wait_s"] = round(
                answer["predicted_start"]["p50"] - answer["predicted_start"]["computed_at"]
            )
    return {
        "dry_runs": len(took),
        **_latency(took),
        # the predictor's own time per dry run (fork, both runs forward), also where the API gave up at 2 s
        "predictor": _latency(own),
        # dry runs that ran from the fork made ahead of them (the first makes its own)
        "ready_forks": predictor.ready_taken,
        **refreshed,
        **{status: statuses.count(status) for status in STATUSES},
        "by_shape": by_shape,
    }


async def _during_refresh(predictor: _TimedPredictor, url: str, token: str, runs: int) -> dict[str, Any]:
    """The same dry runs while the predictor's next refresh runs beside them (as it does most of the time
    on a large queue: a refresh of 10,000 waiting jobs takes about a minute): they are fitted into the last
    forecast, the refresh's run forward waiting between its cycles while one is answered
    (``Predictor._dry_gate``). Here the API shares the predictor's process, unlike in a deployment.
    ``overlapped``: the refresh was still running when the last dry run answered."""
    refreshing = asyncio.ensure_future(predictor.refresh())
    first = len(predictor.took)
    took, answers = await _time_dry_runs(url, token, runs, predictor)
    overlapped = not refreshing.done()
    await refreshing
    statuses = [(a["predicted_start"] or {}).get("status", "none") for a in answers]
    return {
        **_latency(took),
        "predictor": _latency(predictor.took[first:]),
        "overlapped": overlapped,
        **{status: statuses.count(status) for status in STATUSES},
    }


async def _serve_and_measure(
    log: EventLog, cfg: argparse.Namespace, tokens: Path, token: str, *, settle: bool
) -> dict[str, Any]:
    app = build_app(
        log,
        config=ApiConfig(source="rallypoint/dryrunbench", queues=bench_queues(total_gpus=cfg.nodes * 8)),
        # as `rally serve api` runs it: the caught-up fold's heap settled out of the collector's way
        follower=FoldFollower(log, settle=settle),
        auth=TokenStore(tokens),
    )
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        fold_s = await _wait_folded(app[FOLLOWER], await log.last_seq())
        url = f"http://127.0.0.1:{port}"
        start = time.perf_counter()
        await _time_dry_runs(url, token, 1)  # builds the scheduler's model of the fold
        first_s = time.perf_counter() - start
        before, cpu = await log.last_seq(), time.process_time()
        took, answers = await _time_dry_runs(url, token, cfg.runs)
        cpu = time.process_time() - cpu
        runs = _predicted_runs(cfg.runs)
        budget = DRY_RUN_BUDGET_S if cfg.predictor_budget is None else cfg.predictor_budget
        exact = DRY_RUN_EXACT_S if cfg.exact_budget is None else cfg.exact_budget
        predicted = await _with_prediction(log, app, url, token, runs, budget, exact_s=exact, refresh=False)
        forecast = await _with_prediction(log, app, url, token, runs, budget, exact_s=exact, refresh=True)
        appended = await log.last_seq() - before
    finally:
        await runner.cleanup()
    return {
        "dry_runs": len(took),
        **_latency(took),
        # this process's CPU (the API and the driver) per dry run: what a busy machine stretches
        "cpu_ms_per_dry_run": round(cpu * 1000 / len(took), 1),
        "first_ms": round(first_s * 1000, 1),
        "api_fold_s": round(fold_s, 1),
        "placed": sum(a["placement"] is not None for a in answers),
        "waiting": sum(a["placement"] is None and a["would_admit"] for a in answers),
        "refused": sum(not a["would_admit"] for a in answers),
        "predicted_start": sorted({(a["predicted_start"] or {}).get("status", "none") for a in answers}),
        "with_prediction": predicted,
        "with_forecast": forecast,
        "appended": appended,
        "log_position": answers[-1]["log_position"],
    }


async def _run(cfg: argparse.Namespace, workdir: Path, settle: bool) -> dict[str, Any]:
    queues = bench_queues(total_gpus=cfg.nodes * 8)
    cluster, waiting, now = settled_workload(cfg.nodes, cfg.pending, cfg.seed, queues)
    tokens = workdir / "tokens.json"
    _, token = create_token(tokens, user="bench", team=TEAM)
    with NatsServer(workdir / "nats") as server:
        nc = await connect_nats(server.url, name="dryrunbench")
        try:
            log = await setup_log(nc)
            # the workload's clock moved to the wall clock's: dry runs are judged now
            workload = workload_events(cluster, waiting, queues, shift=time.time() - now)
            events = await _append_all(log, workload)
            out = await _serve_and_measure(log, cfg, tokens, token, settle=settle)
        finally:
            await nc.close()
    return {
        "nodes": cfg.nodes,
        "gpus_per_node": 8,
        "pending": len(waiting),
        "running": len(cluster.running),
        "events": events,
        **out,
    }


def run(cfg: argparse.Namespace, *, settle: bool = True) -> dict[str, Any]:
    """The figures (``settle=False`` in a test: the test runner's heap is not the bench's to freeze)."""
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="rally-dryrunbench-") as folder:
        out = asyncio.run(_run(cfg, Path(folder), settle))
    return {**out, "load_1m_before": load, "load_1m_after": round(os.getloadavg()[0], 2)}


def check(cfg: argparse.Namespace) -> str | None:
    """A one-line error for arguments the bench cannot run with, else None."""
    if cfg.predictor_budget is not None and cfg.predictor_budget <= 0:
        return "error: --predictor-budget must be above 0 seconds"
    if cfg.exact_budget is not None and cfg.exact_budget < 0:
        return "error: --exact-budget must be 0 seconds or more"
    if cfg.nodes < 4 or cfg.pending < 0 or cfg.runs < 1:
        return "error: --nodes must be at least 4, --pending at least 0, --runs at least 1"
    return None
