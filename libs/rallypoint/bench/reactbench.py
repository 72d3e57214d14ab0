"""What each service of a live cluster spends, in CPU, on one short job's whole life.

``python -m rallypoint.bench.reactbench --nodes 2500 --jobs 1000 --json`` starts a local cluster
(every real service, nats-server, PostgreSQL and the projector) with fleet processes serving the nodes
(``rallypoint.agent.fleet``, no agent processes), then:

1. an idle window: the CPU every process spends with no job in the system (heartbeats, ticks), per
   second, so what the jobs cost can be told apart from what the cluster costs anyway;
2. ``--rounds`` rounds of ``--jobs`` one-GPU jobs appended straight to the log as the API's
   ``JobSubmitted`` (``loadgen.append_burst``), paced at ``--rate`` per second, each running
   ``--run-s`` seconds: submitted -> bound -> started -> finished. A round ends once every job is
   ``JobCompleted`` and the projector has committed the log's last sequence (so its writes are counted).

For each round: the CPU milliseconds every process spent per job, as measured and net of the idle rate
over the round's length (``cpu_ms_per_job`` / ``net_cpu_ms_per_job``), PostgreSQL's backends included;
and the load average around it: on a shared machine compare only figures of one run, or runs at a
similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.infra.proccpu import tree_cpu_seconds
from rallypoint.localcluster.supervisor import LocalCluster

from .clusterbench import _cpu_seconds, _wait_caught_up
from .fleetprocs import start_fleets
from .loadgen import append_burst
from .logwatch import LogWatch

NODES_PER_RACK = 32
#: jobs appended together, ``rate / CHUNKS_PER_S`` at a time: paced as submissions arrive, not a burst
CHUNKS_PER_S = 10


@dataclass(frozen=True)
class ReactConfig:
    nodes: int = 2500
    jobs: int = 1000
    rate: float = 250.0
    run_s: float = 10.0
    rounds: int = 2
    idle_s: float = 10.0
    fleets: int = 2
    heartbeat_interval_s: float = 5.0
    timeout_s: float = 120.0


def _postgres_cpu(cluster: LocalCluster) -> float:
    """CPU seconds of the PostgreSQL server and its backends; a backend that ended takes its share with
    it, but the projector keeps one connection throughout."""
    if cluster.postgres is None or cluster.postgres.pid is None:
        return 0.0
    return tree_cpu_seconds(cluster.postgres.pid) or 0.0


def _cpu(cluster: LocalCluster) -> dict[str, float]:
    return {**_cpu_seconds(cluster), "postgres": _postgres_cpu(cluster)}


def _per_job(
    before: dict[str, float],
    after: dict[str, float],
    jobs: int,
    idle: dict[str, float] | None,
    seconds: float,
) -> dict[str, float]:
    """CPU ms per job by process, busiest first; ``idle`` (CPU s per s) is taken off over ``seconds``."""
    out = {}
    for name, used in after.items():
        spent = used - before.get(name, used)
        if idle is not None:
            spent -= idle.get(name, 0.0) * seconds
        out[name] = spent * 1000 / jobs
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.005}


async def _projected(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT coalesce(max(seq), 0) FROM rally.projection_position") or 0)
    finally:
        await conn.close()


async def _until_projected(dsn: str, log: EventLog, timeout: float) -> bool:
    """Until the projector committed the log's last sequence as of now."""
    target = await log.last_seq()
    deadline = time.monotonic() + timeout
    while await _projected(dsn) < target:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def _idle(cluster: LocalCluster, seconds: float) -> dict[str, float]:
    """CPU seconds per second each process spends with no job in the system."""
    before = _cpu(cluster)
    await asyncio.sleep(seconds)
    after = _cpu(cluster)
    return {name: (after[name] - before.get(name, after[name])) / seconds for name in after}


async def _append_paced(log: EventLog, cfg: ReactConfig, prefix: str) -> list[str]:
    """``cfg.jobs`` one-GPU jobs at ``cfg.rate`` per second, in chunks a tenth of a second apart."""
    chunk = max(1, round(cfg.rate / CHUNKS_PER_S))
    ids: list[str] = []
    started = time.monotonic()
    for n, first in enumerate(range(0, cfg.jobs, chunk)):
        count = min(chunk, cfg.jobs - first)
        ids += await append_burst(log, count, gpus=1, seconds=cfg.run_s, prefix=f"{prefix}-{n}")
        await asyncio.sleep(max(0.0, started + (n + 1) / CHUNKS_PER_S - time.monotonic()))
    return ids


async def _round(
    cluster: LocalCluster, log: EventLog, watch: LogWatch, cfg: ReactConfig, idle: dict[str, float], n: int
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    before = _cpu(cluster)
    ids = await _append_paced(log, cfg, f"react{n}")
    appended_s = time.monotonic() - began
    done = await watch.wait(lambda: all(j in watch.completed for j in ids), cfg.timeout_s)
    projected = await _until_projected(cluster.postgres_dsn, log, cfg.timeout_s)
    seconds = time.monotonic() - began
    after = _cpu(cluster)
    completed = sum(j in watch.completed for j in ids)
    gross = _per_job(before, after, max(1, completed), None, seconds)
    net = _per_job(before, after, max(1, completed), idle, seconds)
    return {
        "jobs": len(ids),
        "completed": completed,
        "all_completed": done,
        "projected": projected,
        "append_s": round(appended_s, 2),
        "round_s": round(seconds, 2),
        "load_1m_before": round(load_before, 2),
        "load_1m_after": round(os.getloadavg()[0], 2),
        "cpu_ms_per_job": gross,
        # Only for a process that spent a measurable time per job: CPU time is counted in clock ticks
        # (10 ms), so one that used none in the round (the health monitor, which folds no job event)
        # would show its idle rate taken off nothing, a negative cost.
        "net_cpu_ms_per_job": {name: ms for name, ms in net.items() if name in gross},
    }


async def _drive(cluster: LocalCluster, cfg: ReactConfig) -> dict[str, Any]:
    nc = await connect_nats(cluster.nats_url, name="bench-react")
    watch = LogWatch(nc)
    try:
        log = await EventLog.attach(nc, create=False)
        await watch.start(1)
        _phase("waiting for every service to fold the registrations")
        await _wait_caught_up(cluster, log, timeout=300)
        await _until_projected(cluster.postgres_dsn, log, 300)
        _phase(f"idle for {cfg.idle_s:.0f} s")
        idle = await _idle(cluster, cfg.idle_s)
        out: dict[str, Any] = {"idle_cpu_ms_per_s": {k: round(v * 1000, 2) for k, v in sorted(idle.items())}}
        rounds = []
        for n in range(cfg.rounds):
            _phase(f"round {n + 1} of {cfg.rounds}: {cfg.jobs} jobs at {cfg.rate:.0f}/s")
            rounds.append(await _round(cluster, log, watch, cfg, idle, n))
        out["rounds"] = rounds
        return out
    finally:
        await watch.stop()
        await nc.close()


def run(cfg: ReactConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nodes": cfg.nodes,
        "jobs": cfg.jobs,
        "rate": cfg.rate,
        "run_s": cfg.run_s,
        "load_1m_start": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="rally-reactbench-") as folder:
        cluster = LocalCluster(
            Path(folder),
            nodes=cfg.nodes,
            racks=max(1, cfg.nodes // NODES_PER_RACK),
            with_agents=False,
        )
        with cluster:
            _phase(f"cluster of {cfg.nodes} simulated nodes up; starting {cfg.fleets} fleets")
            fleets = start_fleets(
                cluster, fleets=cfg.fleets, silence=0, heartbeat_interval_s=cfg.heartbeat_interval_s
            )
            fleets.wait_ready(timeout=300)
            out |= asyncio.run(_drive(cluster, cfg))
    out["load_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def _phase(name: str) -> None:
    """Progress on stderr: a run takes a minute or two."""
    print(f"{time.strftime('%H:%M:%S')} reactbench: {name}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.reactbench", description=__doc__)
    defaults = ReactConfig()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="simulated nodes, 8 GPUs each")
    parser.add_argument("--jobs", type=int, default=defaults.jobs, help="one-GPU jobs per round")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="jobs appended per second")
    parser.add_argument("--run-s", type=float, default=defaults.run_s, help="seconds each job runs")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="rounds of --jobs jobs")
    parser.add_argument("--idle-s", type=float, default=defaults.idle_s, help="idle window, seconds")
    parser.add_argument("--fleets", type=int, default=defaults.fleets, help="fleet processes")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout (else indented)")
    args = parser.parse_args(argv)
    cfg = ReactConfig(
        nodes=args.nodes,
        jobs=args.jobs,
        rate=args.rate,
        run_s=args.run_s,
        rounds=args.rounds,
        idle_s=args.idle_s,
        fleets=args.fleets,
    )
    result = run(cfg)
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
