"""`rally bench cluster`: the real services against N simulated nodes, each figure beside its reference.

A local cluster (nats-server with the production permissions, every service its own process, two
schedulers) runs without agent processes; a few fleet processes (``rallypoint.agent.fleet``) serve all
N nodes instead: registration, heartbeats, commands and rank exits as real agents send them, ranks
virtual. In order, on the running cluster:

1. submissions: ``--jobs`` HTTP submissions, 16 in flight (``leanhttp``: a load generator that costs
   the shared cores little), beside as many raw acked JetStream publishes at the same concurrency on
   the same server, before and after (``raw_publish_per_s``), as many requests accepted by a bare HTTP
   front that only publishes each into the same scratch stream, before and after too
   (``http_ceiling_per_s``, ``httpceiling``: the most any HTTP API could accept here), and as many of
   the API's JobSubmitted
   appended straight to the log in halves around the HTTP halves (``raw_append_per_s``: the cluster
   reacts to those as to the API's); the CPU each process spent per accepted submission meanwhile
   (``submissions_cpu_ms_per_job``), and that sum over what folding one job's events costs this process
   just before and after the window (``submissions_cpu_over_reference``, ``bench.reference``: the same
   code reads the same on a slow hour of a shared machine as on a fast one); then submit -> running;
2. a burst of jobs (``--burst-gpus`` each; whole nodes by default) appended to the log at once: binds
   per second (``binds_per_s``: from the moment the first bind could be decided to the last one stored),
   the live cycle (``cycle_ms_live``: from the store time of the log position a cycle decided on to its
   first decision stored; ``cycle_ms_live_from_start`` from the cycle's start, admissions and fold
   waits included), all read from the log's store times so no service needs instrumenting; and the
   leader's own CPU per deciding cycle meanwhile (``cycle_cpu_ms_live``, from its
   ``rally_scheduler_cycle_compute_cpu_seconds``);
3. a burst of capacity: every node taken by long gangs, ``--capacity`` one-node gangs queued behind
   them, then one gang of that many nodes cancelled: binds per second from its ``JobCancelled`` stored
   to the last waiting gang's bind stored (``capacity_binds_per_s``), and that cycle's CPU; the rate the
   leader's fenced writes stored events at meanwhile (``capacity_write_events_per_s``: its own
   ``rally_scheduler_write_seconds``, from each batch's encode until the leader's loop takes the server's
   acknowledgement, so its folding meanwhile counts too);
4. mass silence: ``--silence`` nodes stop heartbeating at once; when each was flagged
   (``NodeHeartbeatLost``, then ``NodeLost``), counted from the silencing, against the thresholds, and
   every node flagged while it heartbeated (``false_alarms``; ``false_alarms_while_starting`` for those
   flagged before every node was registered and every service caught up);
5. failover: the scheduler leader is killed (-9) until the next leader's epoch is stored; with
   ``--replicas`` (e.g. ``job-controller=2,health-monitor=2,checkpoint=2``), per partitioned service with
   two replicas or more, its replica owning most partitions is killed (-9) until a survivor has fenced
   each of them (``handovers``, ``bench.handovers``); ``--nats-servers 3`` runs it all on a three-server
   JetStream cluster (R3), and ``submissions_cpu_ms_per_job`` then lists every replica and server;
with the peak RSS of every process throughout, the warnings each logged, and any service that exited before
the kills (``services_exited``: nothing here restarts one). Then, with that cluster
stopped (the core benches want the CPU to themselves): zombies on a small cluster of real agents after
``--zombie-jobs`` short real jobs, ``rally bench scheduler`` at the same size (``cycle_ms_core``) and
``rally bench eventlog``'s best fenced / batched append rate (``append_per_s``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.infra.proccpu import cpu_seconds, tree_cpu_seconds
from rallypoint.localcluster.http import auth_headers
from rallypoint.localcluster.supervisor import LocalCluster, local_service_seconds

from .apibench import raw_append, raw_job_ids
from .fleetprocs import FleetSet, RssSampler, start_fleets
from .handovers import handovers
from .httpceiling import http_ceiling
from .leadermetrics import LeaderReading, cycle_cpu_ms, read_leader, write_rate
from .leanhttp import submit_lean
from .loadgen import (
    Submitted,
    append_burst,
    append_cancel,
    append_submitted,
    gang_spec,
    latency_summary,
    percentile,
    raw_publish,
    spec_body,
)
from .logwatch import LogWatch
from .reference import fold_us_per_job
from .zombies import zombie_run

CONCURRENCY = 16
#: The bench's own connection's read pacing (``eventlog.pacing``), as the standby scheduler's.
BENCH_READ_PACING_S = 0.02
NODES_PER_RACK = 32  # as `rally bench scheduler` cables its synthetic cluster


@dataclass(frozen=True)
class BenchConfig:
    nodes: int = 12_500
    gpus_per_node: int = 8
    jobs: int = 1000
    burst: int = 2500
    #: GPUs of each job of the burst of submissions (8: one-node gangs on 8-GPU nodes)
    burst_gpus: int = 8
    #: one-node gangs queued behind a full cluster for the burst of capacity (0: no such phase)
    capacity: int = 2500
    silence: int = 2500
    fleets: int = 4
    #: the seed's rate: 12,500 nodes send 2,500 heartbeats/s
    heartbeat_interval_s: float = 5.0
    zombie_jobs: int = 500
    #: how long each job of the two bursts runs once started (the phases wait for them to complete); the
    #: submissions' jobs (and the appended ones beside them) run twice as long, and the burst of capacity
    #: waits for them to end
    job_seconds: float = 5.0
    #: per phase: how long to wait for what it waits on before reporting what happened so far
    phase_timeout_s: float = 120.0
    #: copy every process's log here before the cluster's folder goes (None: they go with it)
    logs: Path | None = None
    #: service -> replicas (``rally up --replicas``); the scheduler a leader and a standby by default
    replicas: tuple[tuple[str, int], ...] = ()
    #: nats-servers: 1, or a JetStream cluster of 3 (R3)
    nats_servers: int = 1
    #: services hosted together over one fold (``rally up --colocate``)
    colocate: tuple[str, ...] = ()


def monitor_thresholds(heartbeat_interval_s: float) -> tuple[float, float]:
    """(unreachable, lost) seconds for the health monitor: the local cluster's 3 s and 8 s at one
    heartbeat a second; at a longer period, 3 and 6 missed heartbeats (the production 30 s at 5 s)."""
    unreachable = local_service_seconds("health-monitor", "--unreachable-after")
    lost = local_service_seconds("health-monitor", "--lost-after")
    return max(unreachable, 3 * heartbeat_interval_s), max(lost, 6 * heartbeat_interval_s)


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


async def _wait_caught_up(
    cluster: LocalCluster, log: EventLog, timeout: float, *, poll_s: float = 1.0, what: str = "registrations"
) -> None:
    """Until every service's fold has applied the log as it is now (``what`` was appended): the whole log,
    or for a fold of part of it (``fold_subjects`` in its health report) the last event stored there."""
    target = await log.last_seq()
    deadline = time.monotonic() + timeout
    subject_targets: dict[str, int] = {}

    def folds() -> dict[str, dict[str, Any]]:
        reports = {}
        for name in cluster.health_ports:
            if not name.startswith("fleet-"):
                _, body = cluster.health(name, "/healthz")
                reports[name] = (body.get("log") or {}) if isinstance(body, dict) else {}
        return reports

    def api_seq() -> int:
        try:
            with urllib.request.urlopen(f"{cluster.api_url}/healthz", timeout=5) as response:
                return int(json.loads(response.read()).get("seq", 0))
        except OSError:
            return 0

    while True:
        late = [] if await asyncio.to_thread(api_seq) >= target else ["api"]
        for name, report in (await asyncio.to_thread(folds)).items():
            subjects = report.get("fold_subjects")
            if subjects is not None and subjects not in subject_targets:
                subject_targets[subjects] = await log.last_seq(subjects)
            seq = report.get("fold_seq")
            if seq is not None and seq < (target if subjects is None else subject_targets[subjects]):
                late.append(name)
        if not late:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"services still folding the {what} after {timeout:.0f} s: {late}")
        await asyncio.sleep(poll_s)


def _cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each process of the cluster, and this one, has used so far."""
    pids = {name: process.pid for name, process in cluster.processes.items()}
    for name, server in cluster.nats_names():
        if server.pid is not None:
            pids[name] = server.pid
    pids["bench"] = os.getpid()
    # a process gone (a fleet that stopped) is left out
    used = {name: spent for name, pid in pids.items() if (spent := cpu_seconds(pid)) is not None}
    # PostgreSQL's work is done in its backends, the server's children (the projector's connections)
    postmaster = cluster.postgres.pid if cluster.postgres is not None else None
    if postmaster is not None and (database := tree_cpu_seconds(postmaster)) is not None:
        used["postgres"] = database
    return used


def _cpu_ms_per_job(
    before: dict[str, float], after: dict[str, float], jobs: int, *, every_process: bool = False
) -> dict[str, float]:
    """Where the machine's CPU went per accepted submission, by process (the busiest first); those that
    spent next to nothing left out unless ``every_process`` (a replica with little to do in a short window
    may have spent less than the kernel's 10 ms tick)."""
    spent = {name: (after[name] - before.get(name, 0.0)) * 1000 / jobs for name in after}
    ordered = sorted(spent.items(), key=lambda kv: -kv[1])
    return {name: round(ms, 3) for name, ms in ordered if every_process or ms >= 0.005}


def _submission_cpu(
    before: dict[str, float], after: dict[str, float], jobs: int, window_s: float, idle: dict[str, float]
) -> dict[str, Any]:
    """The CPU of every process per accepted submission over the settled window, its sum (and the control
    plane's, without the bench's own process and the fleets serving the simulated nodes, whose agents run
    on the GPU nodes), the window, and what the idle cluster would have spent over as long (heartbeats,
    leases: in the sums too)."""
    per_process = _cpu_ms_per_job(before, after, jobs, every_process=True)
    idle_ms = sum(idle.values())
    # the control plane alone: neither the bench's client and log reader nor the simulated nodes' agents
    control = sum(ms for name, ms in per_process.items() if name != "bench" and not name.startswith("fleet-"))
    return {
        "submissions_cpu_ms_per_job": per_process,
        "submissions_cpu_ms_per_job_sum": round(sum(per_process.values()), 3),
        "submissions_cpu_ms_per_job_control_plane": round(control, 3),
        "submissions_cpu_window_s": round(window_s, 3),
        "idle_cpu_ms_per_s": round(idle_ms, 1),
        "idle_cpu_ms_per_s_by_process": idle,
        "submissions_idle_cpu_ms_per_job": round(idle_ms * window_s / jobs, 3),
    }


def _against_yardstick(spent_ms: float, yardstick: list[float]) -> dict[str, Any]:
    """The window's CPU per job (``spent_ms``, every process) over what folding one job's events cost
    this process just before and just after it (``reference.fold_us_per_job``): a figure that moves with
    the code, not with the hour's speed of the machine (the target is judged on the sum itself)."""
    reference_us = sum(yardstick) / len(yardstick)
    return {
        "reference_fold_us_per_job": round(reference_us, 2),
        "reference_fold_us_per_job_before_after": [round(us, 2) for us in yardstick],
        "submissions_cpu_over_reference": round(spent_ms * 1000 / reference_us, 1) if reference_us else None,
    }


def _window_cycles(before: LeaderReading, after: LeaderReading, jobs: int) -> dict[str, Any]:
    """The leader's deciding cycles in the submissions' window and their computing CPU per accepted job
    (``rally_scheduler_cycle_compute_cpu_seconds``: its share of the leader's figure; the rest is its fold
    and its writes)."""
    return {
        "submissions_cycles": after.cycles - before.cycles,
        "submissions_cycle_cpu_ms_per_job": round((after.cycle_cpu_s - before.cycle_cpu_s) * 1000 / jobs, 3),
    }


async def _settle(
    cluster: LocalCluster, log: EventLog, watch: LogWatch, cfg: BenchConfig, ids: list[str], what: str
) -> None:
    """Until every one of ``ids`` runs (its ``JobStarted`` stored) and every service has folded the log
    as it then is."""
    # Polled often: the window's end is when this returns, and each poll's wait is idle time in it.
    if not await watch.wait(lambda: all(j in watch.started for j in ids), cfg.phase_timeout_s, poll_s=0.02):
        _phase(f"not every one of {what} ran within {cfg.phase_timeout_s:.0f} s")
    try:
        await _wait_caught_up(cluster, log, cfg.phase_timeout_s, poll_s=0.05, what=what)
    except TimeoutError as exc:
        _phase(str(exc))


#: How long the idle cluster's CPU is read for, before the submissions' window.
IDLE_WINDOW_S = 2.0


async def _idle_cpu_ms_per_s(cluster: LocalCluster) -> dict[str, float]:
    """CPU ms per second each process spends with nothing to do but the cluster's own upkeep."""
    before = _cpu_seconds(cluster)
    await asyncio.sleep(IDLE_WINDOW_S)
    spent = _cpu_ms_per_job(before, _cpu_seconds(cluster), 1)
    return {name: round(ms / IDLE_WINDOW_S, 1) for name, ms in spent.items()}


async def _submissions(
    cluster: LocalCluster, log: EventLog, watch: LogWatch, cfg: BenchConfig
) -> dict[str, Any]:
    # The raw reference before and after the HTTP run, so a change of load on the shared machine between
    # the two moves the reference as it moves the submissions (their harmonic mean: the same count each).
    raw_before = await raw_publish(watch.nc, cfg.jobs, concurrency=CONCURRENCY)
    body = spec_body("bench-http", 1, 2 * cfg.job_seconds)  # 10 s by default, as the bench always ran them
    # What HTTP alone leaves of the raw rate on these cores now: a bare front, around the HTTP run too.
    token = auth_headers(cluster.api_url).get("Authorization", "").removeprefix("Bearer ") or None
    ceiling = [await _ceiling(cluster, watch, cfg, body, token)]
    half = max(1, cfg.jobs // 2)
    # The same JobSubmitted appended straight to the log, as many in halves around the HTTP halves
    # (append, HTTP, HTTP, append): the cluster reacts to these jobs as to the API's, so the ratio to
    # them is what HTTP and the API add, the cluster's own per-job work being on both sides.
    appended_s = half / await raw_append(
        log, half, concurrency=CONCURRENCY, prefix="rawlog-a", seconds=2 * cfg.job_seconds
    )
    # The window opens on a settled cluster: those reference jobs placed, launched and folded everywhere,
    # so none of their work is charged to the HTTP submissions (before 2026-12-06 it opened as soon as
    # the appends were acknowledged, and the cluster's backlog of them ran inside the window).
    await _settle(cluster, log, watch, cfg, raw_job_ids("rawlog-a", half), "the reference appends")
    # the machine's speed now, outside the window (this process's CPU is in the sums): reference.py
    yardstick = [fold_us_per_job()]
    idle = await _idle_cpu_ms_per_s(cluster)
    # the leader's counters, read outside the window (a scrape renders the whole cluster's gauges)
    leader = _leader(watch)
    cycles_before = await _leader_reading(cluster, leader)
    cpu_before, opened = _cpu_seconds(cluster), time.monotonic()
    accepted: list[Submitted] = []
    took = 0.0
    failed = 0
    for part, count in (("a", half), ("b", cfg.jobs - half)):
        ok, seconds, refused = await submit_lean(
            cluster.api_url, count, concurrency=CONCURRENCY, body=body, prefix=f"http-{part}",
            time_limit_s=60,
        )  # fmt: skip
        accepted += ok
        took += seconds
        failed += refused
    # ... and closes once every accepted job runs and every fold has applied its events: a job's whole
    # way from the request to its ranks running, in every process, and nothing else's.
    await _settle(cluster, log, watch, cfg, [s.job_id for s in accepted], "the submissions")
    cpu_after, window_s = _cpu_seconds(cluster), time.monotonic() - opened
    yardstick.append(fold_us_per_job())
    cycles_after = await _leader_reading(cluster, leader)
    appended_s += half / await raw_append(
        log, half, concurrency=CONCURRENCY, prefix="rawlog-b", seconds=2 * cfg.job_seconds
    )
    ceiling.append(await _ceiling(cluster, watch, cfg, body, token))
    raw_after = await raw_publish(watch.nc, cfg.jobs, concurrency=CONCURRENCY)
    to_running = [watch.started[s.job_id] - s.sent_at for s in accepted if s.job_id in watch.started]
    cpu = _submission_cpu(cpu_before, cpu_after, max(1, len(accepted)), window_s, idle)
    return {
        "submissions": len(accepted),
        "submissions_failed": failed,
        "submissions_per_s": round(len(accepted) / took, 1) if took > 0 else None,
        "raw_publish_per_s": round(2 / (1 / raw_before + 1 / raw_after), 1),
        "raw_publish_before_per_s": round(raw_before, 1),
        "raw_publish_after_per_s": round(raw_after, 1),
        "raw_append_per_s": round(2 * half / appended_s, 1),
        "http_ceiling_per_s": round(2 / (1 / ceiling[0] + 1 / ceiling[1]), 1),
        "http_ceiling_before_per_s": round(ceiling[0], 1),
        "http_ceiling_after_per_s": round(ceiling[1], 1),
        **cpu,
        **_against_yardstick(cpu["submissions_cpu_ms_per_job_sum"], yardstick),
        **_window_cycles(cycles_before, cycles_after, max(1, len(accepted))),
        **latency_summary([s.latency_s for s in accepted], "submit_latency_s"),
        "submitted_running": len(to_running),
        **latency_summary(to_running, "submit_to_running_s"),
    }


async def _ceiling(
    cluster: LocalCluster, watch: LogWatch, cfg: BenchConfig, body: dict[str, Any], token: str | None
) -> float:
    return await http_ceiling(
        watch.nc, cluster.nats_url, cfg.jobs, concurrency=CONCURRENCY, body=body, token=token
    )


async def _burst(log: EventLog, watch: LogWatch, cfg: BenchConfig, count: int) -> dict[str, Any]:
    start = time.time()
    ids = await append_burst(log, count, gpus=cfg.burst_gpus, seconds=cfg.job_seconds, prefix="burst")
    appended = time.time() - start
    await watch.wait(lambda: all(j in watch.bound for j in ids), cfg.phase_timeout_s)
    binds = sorted(watch.bound[j] for j in ids if j in watch.bound)
    span = watch.binds_span(ids)
    await watch.wait(lambda: all(j in watch.completed for j in ids), cfg.phase_timeout_s)
    until = binds[-1] if binds else time.time()
    cycles = watch.cycle_ms(start, until)
    whole = watch.cycle_ms(start, until, from_start=True)
    to_running = [watch.started[j] - start for j in ids if j in watch.started]
    return {
        "burst": count,
        "burst_append_s": round(appended, 3),
        "burst_bound": len(binds),
        "binds_per_s": round(len(binds) / span, 1) if span else None,
        "binds_span_s": _rounded(span),
        "burst_all_bound_s": _rounded(binds[-1] - start if binds else None),
        "cycle_ms_live": percentile(cycles, 0.5),
        "cycle_ms_live_max": _rounded(max(cycles) if cycles else None, 1),
        "cycle_ms_live_from_start": percentile(whole, 0.5),
        "cycles_live": len(cycles),
        "burst_running": len(to_running),
        **latency_summary(to_running, "burst_to_running_s"),
        "burst_completed": sum(j in watch.completed for j in ids),
    }


def _burst_size(cfg: BenchConfig, nodes: int) -> int:
    """The burst, at most a quarter of the cluster's GPUs (and at least one job)."""
    return max(1, min(cfg.burst, nodes * cfg.gpus_per_node // 4 // cfg.burst_gpus))


async def _leader_reading(cluster: LocalCluster, leader: str) -> LeaderReading:
    return await asyncio.to_thread(read_leader, cluster.health_ports.get(leader))


async def _settled_reading(cluster: LocalCluster, leader: str, timeout: float = 10.0) -> LeaderReading:
    """The leader's reading once two in a row, 0.1 s apart, count the same writes."""
    deadline = time.monotonic() + timeout
    last = await _leader_reading(cluster, leader)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = await _leader_reading(cluster, leader)
        if (now.writes, now.written) == (last.writes, last.written):
            return now
        last = now
    return last


def _leader(watch: LogWatch) -> str:
    return watch.epochs[-1][1] if watch.epochs else "scheduler-1"


def _fillers(nodes: int, release: int) -> list[int]:
    """Gang sizes (nodes each) that together take every node: the first, ``release`` nodes, is the one
    cancelled to free capacity at once; the rest in gangs of at most as many."""
    sizes = [release]
    left = nodes - release
    while left > 0:
        sizes.append(min(release, left))
        left -= sizes[-1]
    return sizes


async def _capacity_burst(
    cluster: LocalCluster, log: EventLog, watch: LogWatch, cfg: BenchConfig, count: int
) -> dict[str, Any]:
    """A burst of capacity: the cluster full of long gangs, ``count`` one-node gangs waiting, then one
    gang of ``count`` nodes cancelled. Times the binds from the moment its GPUs were free in the log (its
    ``JobCancelled`` stored) to the last of the waiting gangs' binds stored: what the scheduler decides and
    writes when the work is already queued, which a burst of submissions never shows (there the binds
    follow the submissions' own arrival)."""
    fillers = [f"fill-{i}" for i in range(len(_fillers(cluster.nodes, count)))]
    for job_id, size in zip(fillers, _fillers(cluster.nodes, count), strict=True):
        await append_submitted(log, [job_id], gang_spec(job_id, size, cfg.gpus_per_node, 3600))
    await watch.wait(lambda: all(j in watch.started for j in fillers), cfg.phase_timeout_s)
    waiting = [f"wait-{i}" for i in range(count)]
    await append_submitted(log, waiting, gang_spec("wait", 1, cfg.gpus_per_node, cfg.job_seconds))
    # Every waiting gang considered by a cycle and found nowhere to go (its first JobPending), that
    # cycle's writes folded by every service and their time counted by the leader: the cancel alone
    # starts what is measured.
    await watch.wait(lambda: all(j in watch.pending for j in waiting), cfg.phase_timeout_s)
    await _wait_caught_up(cluster, log, cfg.phase_timeout_s, poll_s=0.1, what="waiting gangs")
    leader = _leader(watch)
    reading = await _settled_reading(cluster, leader)
    used_before = _cpu_seconds(cluster)
    await append_cancel(log, fillers[0])
    await watch.wait(lambda: all(j in watch.bound for j in waiting), cfg.phase_timeout_s)
    used = _cpu_ms_per_job(used_before, _cpu_seconds(cluster), 1)
    read_after = await _leader_reading(cluster, leader)
    written = write_rate(reading, read_after)
    freed = watch.cancelled.get(fillers[0])
    binds = sorted(watch.bound[j] for j in waiting if j in watch.bound)
    for job_id in fillers[1:]:
        await append_cancel(log, job_id)
    settled = [*fillers, *waiting]
    await watch.wait(
        lambda: all(j in watch.completed or j in watch.cancelled for j in settled), cfg.phase_timeout_s
    )
    took = binds[-1] - freed if binds and freed is not None else None
    return {
        "capacity_burst": count,
        "capacity_fillers": len(fillers),
        "capacity_bound": len(binds),
        "capacity_first_bind_s": _rounded(binds[0] - freed if binds and freed is not None else None),
        "capacity_all_bound_s": _rounded(took),
        "capacity_binds_per_s": round(len(binds) / took, 1) if took else None,
        "capacity_cycle_cpu_ms": cycle_cpu_ms(reading, read_after),
        # the leader's fenced writes alone, as it sees them (encode to acknowledgement taken): binds
        # written per second of writing
        "capacity_write_events_per_s": written.pop("events_per_s"),
        **{f"capacity_write_{k}": v for k, v in written.items()},
        # CPU ms each process spent from the cancel to the last bind: who shares the 2 cores meanwhile
        "capacity_cpu_ms": used,
        **(_capacity_timeline(watch, waiting, freed) if freed is not None else {}),
    }


def _capacity_timeline(watch: LogWatch, job_ids: list[str], freed: float) -> dict[str, Any]:
    """Seconds after the capacity was freed: when the first binding cycle started, when the log position
    it decided on was stored, and the store times of the binds' writes (an atomic batch's events are
    stored within a few ms of each other; a gap of 50 ms or more starts the next write)."""
    first = min((j for j in job_ids if j in watch.bound), key=lambda j: watch.bound[j], default=None)
    if first is None:
        return {}
    decided_on = watch.stored_at.get(watch.bound_from[first])
    writes: list[list[float]] = []
    for t in sorted(watch.bound[j] for j in job_ids if j in watch.bound):
        if writes and t - writes[-1][1] < 0.05:
            writes[-1][1:] = [t, writes[-1][2] + 1]
        else:
            writes.append([t, t, 1])
    return {
        "capacity_cycle_start_s": _rounded(watch.bound_cycle[first] - freed),
        "capacity_decided_on_s": _rounded(decided_on - freed if decided_on is not None else None),
        "capacity_writes": [[_rounded(a - freed), _rounded(b - freed), int(n)] for a, b, n in writes],
    }


async def _silence(fleets: FleetSet, watch: LogWatch, cfg: BenchConfig) -> dict[str, Any]:
    nodes = fleets.silenced
    unreachable, lost_after = monitor_thresholds(cfg.heartbeat_interval_s)
    start = time.time()
    fleets.silence()

    def after(times: dict[str, list[float]]) -> list[float]:
        found = (watch.first_after(times, n, start) for n in nodes)
        return [t - start for t in found if t is not None]

    timeout = cfg.phase_timeout_s
    await watch.wait(lambda: len(after(watch.heartbeat_lost)) == len(nodes), unreachable + timeout)
    await watch.wait(lambda: len(after(watch.lost)) == len(nodes), lost_after + timeout)
    fleets.resume()
    flagged, lost = after(watch.heartbeat_lost), after(watch.lost)
    return {
        "silence_started": start,
        "silence_nodes": len(nodes),
        "silence_flagged": len(flagged),
        "silence_threshold_s": unreachable,
        "silence_flagged_min_s": _rounded(min(flagged) if flagged else None),
        "silence_flagged_max_s": _rounded(max(flagged) if flagged else None),
        "silence_lost": len(lost),
        "silence_lost_threshold_s": lost_after,
        "silence_lost_max_s": _rounded(max(lost) if lost else None),
    }


def _false_alarms(
    watch: LogWatch, silenced: set[str], silence_started: float, ready: float
) -> dict[str, int]:
    """NodeHeartbeatLost of nodes that were heartbeating (any of the others', the silenced ones' before):
    from the moment every node was registered and every service caught up (``false_alarms``), and before
    it, while the fleets were still registering their nodes (``false_alarms_while_starting``: on a starved
    machine a fleet's loop, registering thousands of nodes, cannot keep their first heartbeats on time,
    which no real agent, one per machine, shares)."""
    alarms = [
        t
        for node, times in watch.heartbeat_lost.items()
        for t in times
        if node not in silenced or t < silence_started
    ]
    return {
        "false_alarms": sum(t >= ready for t in alarms),
        "false_alarms_while_starting": sum(t < ready for t in alarms),
    }


async def _failover(cluster: LocalCluster, watch: LogWatch, cfg: BenchConfig) -> dict[str, Any]:
    if not watch.epochs:
        return {"failover_s": None}
    leader = watch.epochs[-1][1]
    start = time.time()
    await asyncio.to_thread(cluster.kill, leader)
    await watch.wait(lambda: watch.epochs[-1][0] > start, cfg.phase_timeout_s)
    after = watch.epochs[-1]
    cluster.restart(leader)  # back as a standby, as the supervisor of `rally up` would
    return {
        "failover_killed": leader,
        "failover_new_leader": after[1] if after[0] > start else None,
        "failover_s": _rounded(after[0] - start) if after[0] > start else None,
    }


async def _drive(cluster: LocalCluster, fleets: FleetSet, cfg: BenchConfig) -> dict[str, Any]:
    # The log reader times everything by the server's store times, so it may read a trickle late, as the
    # services that are not on a job's way to running do (its CPU is in the sums too).
    nc = await connect_nats(cluster.nats_url, name="bench-cluster", read_pacing_s=BENCH_READ_PACING_S)
    watch = LogWatch(nc)
    try:
        log = await EventLog.attach(nc, create=False)
        await watch.start(1)
        started = time.monotonic()
        _phase("waiting for every service to fold the registrations")
        await _wait_caught_up(cluster, log, timeout=300)
        out: dict[str, Any] = {"ready_s": round(time.monotonic() - started, 1)}
        ready = time.time()
        _phase("submissions")
        out |= await _submissions(cluster, log, watch, cfg)
        _phase("burst")
        reading = await _leader_reading(cluster, _leader(watch))
        out |= await _burst(log, watch, cfg, _burst_size(cfg, cluster.nodes))
        read_after = await _leader_reading(cluster, _leader(watch))
        out["cycle_cpu_ms_live"] = cycle_cpu_ms(reading, read_after)
        out["burst_write_events_per_s"] = write_rate(reading, read_after)["events_per_s"]
        if capacity := min(cfg.capacity, cluster.nodes // 4):
            _phase("capacity burst")
            out |= await _capacity_burst(cluster, log, watch, cfg, capacity)
        _phase("mass silence")
        out |= await _silence(fleets, watch, cfg)
        out["services_exited"] = _exited(cluster)  # before the phases that kill on purpose
        _phase("leader kill")
        out |= await _failover(cluster, watch, cfg)
        out |= await handovers(cluster, watch, dict(cfg.replicas), cfg.phase_timeout_s)
        out |= _false_alarms(watch, set(fleets.silenced), out.pop("silence_started"), ready)
        out["log_events"] = watch.last_seq
        out["logwatch_resubscribed"] = watch.resubscribed  # the bench's own reader skipped and read again
        out["logwatch_stalled"] = watch.stalled  # of those: it had stopped reading
        return out
    finally:
        await watch.stop()
        await nc.close()


def _live(cfg: BenchConfig) -> dict[str, Any]:
    racks = max(1, cfg.nodes // NODES_PER_RACK)
    with tempfile.TemporaryDirectory(prefix="rally-bench-cluster-") as folder:
        unreachable, lost = monitor_thresholds(cfg.heartbeat_interval_s)
        monitor = ("--unreachable-after", str(unreachable), "--lost-after", str(lost))
        cluster = LocalCluster(
            Path(folder),
            nodes=cfg.nodes,
            gpus_per_node=cfg.gpus_per_node,
            racks=racks,
            with_agents=False,
            service_args={"health-monitor": monitor},
            replicas=dict(cfg.replicas),
            nats_servers=cfg.nats_servers,
            colocate=cfg.colocate,
        )
        with cluster:
            began = time.monotonic()
            silence = min(cfg.silence, cfg.nodes // 5)
            fleets = start_fleets(
                cluster, fleets=cfg.fleets, silence=silence, heartbeat_interval_s=cfg.heartbeat_interval_s
            )
            sampler = RssSampler(cluster)
            sampler.start()
            try:
                fleets.wait_ready(timeout=300)
                out: dict[str, Any] = {"fleets_up_s": round(time.monotonic() - began, 1)}
                out |= asyncio.run(_drive(cluster, fleets, cfg))
            finally:
                out_rss = sampler.stop()
            out["rss_mb"] = out_rss
            out["warnings_logged"] = _warnings(cluster)
        if cfg.logs is not None:
            shutil.copytree(cluster.workdir / "logs", cfg.logs, dirs_exist_ok=True)
        return out


def _exited(cluster: LocalCluster) -> dict[str, int | None]:
    """The cluster's processes that have exited (name -> exit code), said on stderr too: nothing here
    restarts a crashed service as `rally up`'s supervisor would, so a crash must not pass for a quiet
    service in the figures (a projector that stopped spends no CPU per job)."""
    exited = {name: p.popen.returncode for name, p in cluster.processes.items() if not p.running()}
    for name, code in exited.items():
        _phase(f"{name} exited with code {code}: the figures after it are without it (see its log)")
    return exited


def _warnings(cluster: LocalCluster) -> dict[str, int]:
    """Warning and error lines each process logged (timeouts, retries, refusals), where there were any."""
    counts = {}
    for path in sorted((cluster.workdir / "logs").glob("*.log")):
        with path.open("rb") as lines:
            n = sum(b'"level":"WARNING"' in line or b'"level":"ERROR"' in line for line in lines)
        if n:
            counts[path.stem] = n
    return counts


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    from rallypoint.bench.corebench import run_bench as core_bench
    from rallypoint.bench.eventlogbench import run_bench as eventlog_bench

    started = time.monotonic()
    out: dict[str, Any] = {
        "load_1m_before": round(os.getloadavg()[0], 2),
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "fleets": min(cfg.fleets, cfg.nodes),
        "heartbeats_per_s": round(cfg.nodes / cfg.heartbeat_interval_s),
        "concurrency": CONCURRENCY,
        "replicas": dict(cfg.replicas),
        "nats_servers": cfg.nats_servers,
    }
    _phase(f"starting a cluster of {cfg.nodes} simulated nodes")
    out |= _live(cfg)
    _phase("zombies")
    out |= zombie_run(cfg.zombie_jobs, timeout=cfg.phase_timeout_s * 3)
    _phase("core scheduler and event log benches")
    pending = max(1, min(cfg.capacity or cfg.burst, cfg.nodes // 4))
    core = core_bench(nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node, pending=pending, seed=1, cycles=5)
    out["cycle_ms_core"] = core["cycle_ms"]["p50"]
    out["cycle_cpu_ms_core"] = core["cycle_cpu_ms"]["p50"]
    log_rates = eventlog_bench(2000)
    out["eventlog"] = log_rates
    out["append_per_s"] = max(
        v for k, v in log_rates.items() if k.startswith("append_") and ("fenced" in k or "batch" in k)
    )
    out |= _ratios(out)
    out["load_1m_after"] = round(os.getloadavg()[0], 2)
    out["bench_s"] = round(time.monotonic() - started, 1)
    return out


def _ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """Each live figure over its same-run reference (the issue's done-when ratios)."""

    def ratio(num: str, den: str) -> float | None:
        a, b = out.get(num), out.get(den)
        return round(a / b, 3) if a is not None and b else None

    return {
        "submissions_over_raw": ratio("submissions_per_s", "raw_publish_per_s"),
        "submissions_over_raw_append": ratio("submissions_per_s", "raw_append_per_s"),
        "submissions_over_http_ceiling": ratio("submissions_per_s", "http_ceiling_per_s"),
        "http_ceiling_over_raw": ratio("http_ceiling_per_s", "raw_publish_per_s"),
        "binds_over_append": ratio("binds_per_s", "append_per_s"),
        "capacity_binds_over_append": ratio("capacity_binds_per_s", "append_per_s"),
        "capacity_write_over_append": ratio("capacity_write_events_per_s", "append_per_s"),
        "cycle_live_over_core": ratio("cycle_ms_live", "cycle_ms_core"),
        "cycle_cpu_live_over_core": ratio("cycle_cpu_ms_live", "cycle_cpu_ms_core"),
        "capacity_cycle_cpu_over_core": ratio("capacity_cycle_cpu_ms", "cycle_cpu_ms_core"),
    }


def _phase(name: str) -> None:
    """Progress on stderr: a full-size run takes minutes."""
    print(f"{time.strftime('%H:%M:%S')} bench cluster: {name}", file=sys.stderr, flush=True)
