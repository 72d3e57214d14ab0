"""The idle tax: what a cluster of N nodes costs the machine when nothing happens but the heartbeats.

``python -m rallypoint.bench.idlebench --nodes 12500 --seconds 30 --json`` starts the cluster as
``rally bench cluster`` starts it (every real service, no agent processes, fleet processes serving the
nodes, one heartbeat per node every ``--heartbeat-interval`` seconds, the health monitor's thresholds
scaled to that period), waits until every service has folded the registrations and ``--settle`` seconds
more, then measures for ``--seconds`` the CPU each process spends per second of wall time: nats-server,
PostgreSQL (its server and backends together), every service, the fleets. Nothing is submitted, so the
difference between two cluster sizes is the tax the heartbeats (and the folds' size) put on the cores
every submission shares.

The heartbeat rate is the one the health monitor counted itself (its ``rally_heartbeats_received``
counter, read from /metrics before and after), so the bench adds no subscriber to nats-server's fan-out.
CPU is read from /proc (user + system), not timed, so other work on a shared machine moves the figures
less than it would move a throughput; the load average before and after says how shared it was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.infra.proccpu import tree_cpu_seconds
from rallypoint.localcluster.supervisor import LocalCluster

from .clusterbench import NODES_PER_RACK, _cpu_seconds, _wait_caught_up, monitor_thresholds
from .fleetprocs import start_fleets

MONITOR = "health-monitor"
_RECEIVED = re.compile(rb'^rally_heartbeats_received_total\{result="ok"\} ([0-9.e+]+)$', re.MULTILINE)


@dataclass(frozen=True)
class IdleConfig:
    nodes: int = 12_500
    gpus_per_node: int = 8
    fleets: int = 4
    #: the seed's rate: 12,500 nodes send 2,500 heartbeats/s
    heartbeat_interval_s: float = 5.0
    seconds: float = 30.0
    #: after every fold caught up: past the services' first snapshot of the registrations (they check
    #: every 30 s, ``following.snapshot_check_s()``), one-time work that is no part of the idle tax
    settle_s: float = 35.0


def _postgres_seconds(cluster: LocalCluster) -> float | None:
    """CPU seconds of the PostgreSQL server and its live backends (a backend that exited is not counted:
    none does while the cluster idles, the projector keeps its pool)."""
    if cluster.postgres is None or cluster.postgres.pid is None:
        return None
    return tree_cpu_seconds(cluster.postgres.pid)


def cpu_snapshot(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds used so far by every process of the cluster (and this one, as ``bench``)."""
    used = _cpu_seconds(cluster)
    postgres = _postgres_seconds(cluster)
    if postgres is not None:
        used["postgres"] = postgres
    return used


def heartbeats_received(cluster: LocalCluster) -> float | None:
    """The health monitor's own count of the heartbeats it decoded."""
    url = f"http://127.0.0.1:{cluster.health_ports[MONITOR]}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
    except OSError:
        return None
    found = _RECEIVED.search(body)
    return float(found.group(1)) if found else None


def log_sizes(cluster: LocalCluster) -> dict[str, int]:
    """How long each process's log is now."""
    return {path.stem: path.stat().st_size for path in (cluster.workdir / "logs").glob("*.log")}


def saved_snapshots(cluster: LocalCluster, since: dict[str, int]) -> list[str]:
    """The processes that saved a snapshot after ``since`` (their log sizes then): one-time work in the
    window, said so beside the figures it inflates."""
    saved = []
    for name, offset in sorted(since.items()):
        with (cluster.workdir / "logs" / f"{name}.log").open("rb") as log:
            log.seek(offset)
            if b"saved snapshot" in log.read():
                saved.append(name)
    return saved


def cpu_ms_per_s(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU milliseconds per second of wall time, by process, the busiest first."""
    spent = {name: (after[name] - before[name]) * 1000 / seconds for name in after if name in before}
    return {name: round(ms, 1) for name, ms in sorted(spent.items(), key=lambda kv: -kv[1])}


async def _measure(cluster: LocalCluster, cfg: IdleConfig) -> dict[str, Any]:
    nc = await connect_nats(cluster.nats_url, name="bench-idle")
    try:
        log = await EventLog.attach(nc, create=False)
        started = time.monotonic()
        _phase("waiting for every service to fold the registrations")
        await _wait_caught_up(cluster, log, timeout=300)
        ready_s = time.monotonic() - started
    finally:
        await nc.close()  # this connection costs nats-server nothing while the cluster is measured
    _phase(f"settling {cfg.settle_s:.0f} s, then measuring {cfg.seconds:.0f} s")
    await asyncio.sleep(cfg.settle_s)
    beats_before = await asyncio.to_thread(heartbeats_received, cluster)
    logs = log_sizes(cluster)
    cpu_before, began = cpu_snapshot(cluster), time.monotonic()
    await asyncio.sleep(cfg.seconds)
    cpu_after, took = cpu_snapshot(cluster), time.monotonic() - began
    snapshots = saved_snapshots(cluster, logs)
    beats_after = await asyncio.to_thread(heartbeats_received, cluster)
    per_process = cpu_ms_per_s(cpu_before, cpu_after, took)
    bench = per_process.pop("bench", 0.0)
    beats = None if beats_before is None or beats_after is None else (beats_after - beats_before) / took
    monitor = per_process.get(MONITOR)
    return {
        "ready_s": round(ready_s, 1),
        "measured_s": round(took, 1),
        "cpu_ms_per_s": per_process,
        "cpu_ms_per_s_total": round(sum(per_process.values()), 1),
        "cpu_ms_per_s_bench_itself": bench,
        "heartbeats_per_s": None if beats is None else round(beats, 1),
        "saved_snapshot_while_measured": snapshots,
        "monitor_cpu_us_per_heartbeat": (
            round(monitor * 1000 / beats, 1) if monitor is not None and beats else None
        ),
    }


def run_idle(cfg: IdleConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "fleets": min(cfg.fleets, cfg.nodes),
        "heartbeat_interval_s": cfg.heartbeat_interval_s,
    }
    racks = max(1, cfg.nodes // NODES_PER_RACK)
    unreachable, lost = monitor_thresholds(cfg.heartbeat_interval_s)
    monitor = ("--unreachable-after", str(unreachable), "--lost-after", str(lost))
    with tempfile.TemporaryDirectory(prefix="rally-bench-idle-") as folder:
        _phase(f"starting a cluster of {cfg.nodes} simulated nodes")
        cluster = LocalCluster(
            Path(folder),
            nodes=cfg.nodes,
            gpus_per_node=cfg.gpus_per_node,
            racks=racks,
            with_agents=False,
            service_args={MONITOR: monitor},
        )
        with cluster:
            fleets = start_fleets(
                cluster, fleets=cfg.fleets, silence=0, heartbeat_interval_s=cfg.heartbeat_interval_s
            )
            fleets.wait_ready(timeout=300)
            out |= asyncio.run(_measure(cluster, cfg))
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _phase(name: str) -> None:
    """Progress on stderr: a full-size run takes minutes."""
    print(f"{time.strftime('%H:%M:%S')} bench idle: {name}", file=sys.stderr, flush=True)


def _text(out: dict[str, Any]) -> str:
    lines = [f"{out['nodes']} nodes, {out.get('heartbeats_per_s')} heartbeats/s over {out['measured_s']} s"]
    lines += [f"  {name:<16} {ms:8.1f} ms/s" for name, ms in out["cpu_ms_per_s"].items()]
    lines.append(f"  {'total':<16} {out['cpu_ms_per_s_total']:8.1f} ms/s")
    lines.append(f"load average before {out['load_before']}, after {out['load_after']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.idlebench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=IdleConfig.nodes)
    parser.add_argument("--gpus-per-node", type=int, default=IdleConfig.gpus_per_node)
    parser.add_argument("--fleets", type=int, default=IdleConfig.fleets)
    parser.add_argument("--heartbeat-interval", type=float, default=IdleConfig.heartbeat_interval_s)
    parser.add_argument("--seconds", type=float, default=IdleConfig.seconds, help="how long to measure")
    parser.add_argument("--settle", type=float, default=IdleConfig.settle_s, help="seconds before measuring")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    cfg = IdleConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        fleets=args.fleets,
        heartbeat_interval_s=args.heartbeat_interval,
        seconds=args.seconds,
        settle_s=args.settle,
    )
    out = run_idle(cfg)
    print(json.dumps(out) if args.json else _text(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
