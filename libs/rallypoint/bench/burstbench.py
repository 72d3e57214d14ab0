"""A burst of one-node gangs against the live scheduler service's loop, on a real NATS server.

What ``rally bench cluster``'s burst phase measures, without the rest of the cluster: an embedded server
with ``nodes`` registered nodes; a scheduler led exactly as the service leads it (lease, epoch, a cycle on
every change, ``lead_while_elected``); and, from a separate process as the API would, ``rounds`` bursts of
``burst`` ``JobSubmitted`` appended 256 in flight. Every time is the server's store time, read from the log
(``LogWatch``): binds per second over the span from the position the first bind was decided on to the last
bind stored, and each cycle from the stored position it decided on to its first decision stored.

``python -m rallypoint.bench.burstbench --json``. The scheduler's CPU seconds per job show
what the loop costs whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nats
from rallypoint_services.scheduler.heap import settle_heap
from rallypoint_services.scheduler.leader import SchedulerLoop

from rallypoint.bench.loadgen import append_burst, percentile
from rallypoint.bench.logwatch import LogWatch
from rallypoint.eventlog import EventLog
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.leader import LeaderLease
from rallypoint.runtime.leadership import lead_while_elected
from rallypoint.scheduling import SchedulingPolicy

from .bindsbench import _setup

__all__ = ["run_burst_bench"]

_ROUND_TIMEOUT_S = 300.0
_MODULE = "rallypoint.bench.burstbench"  # the driver runs as this module, in its own process


async def _drive(url: str, burst: int, rounds: int, gpus: int) -> list[dict[str, Any]]:
    """The other process: append each burst, wait for its binds, measure it from the log."""
    log = await EventLog.connect(url, name="burst-driver")
    nc = await nats.connect(url)
    watch = LogWatch(nc)
    await watch.start(await log.last_seq() + 1)
    out = []
    try:
        for r in range(rounds):
            start = time.time()
            ids = await append_burst(log, burst, gpus=gpus, seconds=5, prefix=f"burst{r}")
            appended = time.time() - start
            await watch.wait(lambda: all(j in watch.bound for j in ids), _ROUND_TIMEOUT_S)  # noqa: B023
            binds = sorted(watch.bound[j] for j in ids if j in watch.bound)
            span = watch.binds_span(ids)
            until = binds[-1] if binds else time.time()
            cycles = watch.cycle_ms(start, until)
            out.append(
                {
                    "append_s": round(appended, 3),
                    "bound": len(binds),
                    "binds_per_s": round(len(binds) / span) if span else None,
                    "all_bound_after_append_s": round(until - start - appended, 3),
                    "cycles": len(cycles),
                    "cycle_ms_p50": percentile(cycles, 0.5),
                }
            )
            await asyncio.sleep(1.0)
    finally:
        await watch.stop()
        await nc.close()
        await log.close()
    return out


async def _measure(
    url: str, nodes: int, gpus_per_node: int, burst: int, rounds: int, gpus: int
) -> dict[str, Any]:
    log = await EventLog.connect(url, name="burst-scheduler")
    follower = Follower(log)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await _setup(log, nodes, gpus_per_node, 0, admit=False)
        await follower.catch_up()
        settle_heap()  # as the service does once caught up
        tasks.append(asyncio.create_task(follower.run()))
        lease = await LeaderLease.open(log.js, holder="bench", ttl=3.0)
        loop = SchedulerLoop(log, follower, instance="bench", policy=SchedulingPolicy("rallypoint"))
        tasks.append(asyncio.create_task(lead_while_elected(loop, lease, stop)))
        while loop.epoch == 0:
            await asyncio.sleep(0.05)
        cpu = time.process_time()
        driver = await asyncio.create_subprocess_exec(
            sys.executable, "-m", _MODULE, "--drive", url, "--burst", str(burst), "--rounds", str(rounds),
            "--gpus", str(gpus), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, _ = await driver.communicate()
        cpu = time.process_time() - cpu
        if driver.returncode != 0:
            raise RuntimeError(f"the burst driver exited {driver.returncode}")
        per_round = json.loads(stdout)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await log.close()
    return _summary(per_round, nodes, gpus_per_node, burst, gpus, cpu)


def _summary(
    per_round: list[dict[str, Any]], nodes: int, gpus_per_node: int, burst: int, gpus: int, cpu: float
) -> dict[str, Any]:
    rates = [r["binds_per_s"] for r in per_round if r["binds_per_s"]]
    cycles = [r["cycle_ms_p50"] for r in per_round if r["cycle_ms_p50"] is not None]
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "burst": burst,
        "gpus_per_job": gpus,
        "rounds": per_round,
        "binds_per_s_median": round(statistics.median(rates)) if rates else None,
        "cycle_ms_p50_median": round(statistics.median(cycles), 1) if cycles else None,
        "scheduler_cpu_ms_per_job": round(cpu * 1000 / (burst * len(per_round)), 3) if per_round else None,
        "load_1m": round(os.getloadavg()[0], 2),
    }


def run_burst_bench(
    *, nodes: int = 12_500, gpus_per_node: int = 8, burst: int = 2_500, rounds: int = 3, gpus: int = 8
) -> dict[str, Any]:
    if burst * gpus * rounds > nodes * gpus_per_node:
        raise ValueError("the bursts must fit the cluster: every gang stays bound")
    with tempfile.TemporaryDirectory(prefix="rally-burst-") as tmp, NatsServer(Path(tmp) / "nats") as server:
        return asyncio.run(_measure(server.url, nodes, gpus_per_node, burst, rounds, gpus))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.burstbench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--burst", type=int, default=2_500, help="one-node gangs per burst")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per gang (at most --gpus-per-node)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--drive", metavar="NATS_URL", help=argparse.SUPPRESS)  # the driver process
    args = parser.parse_args(argv)
    if args.drive:
        print(json.dumps(asyncio.run(_drive(args.drive, args.burst, args.rounds, args.gpus))))
        return 0
    res = run_burst_bench(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        burst=args.burst,
        rounds=args.rounds,
        gpus=args.gpus,
    )
    print(json.dumps(res, sort_keys=True) if args.json else json.dumps(res, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
