"""What following the log costs each service per event: ``python -m rallypoint.bench.followbench --json``.

Every service (API, schedulers, job controller, health monitor, ...) receives every event of the log
through one path: the connection hands the JetStream message over (``feeds.DirectFeed``),
``EventLog.follow`` decodes it and ``Follower`` folds it into ``ClusterState``. This bench runs that path
on a real embedded nats-server: a child process appends a realistic log (nodes registered, then each
job's life: submitted, queued, bound, started, its ranks exited, completed) while this process follows
it live with the very ``Follower`` the services use, and reports the CPU this process spent per event
(process time, so other load on the machine does not count). It then splits that cost, offline on the
same messages: the decode into a ``Recorded``, the fold (``Follower._fold``) and, apart, what reading a
message's envelope costs (its headers are parsed only when read: the projector and the job traces do);
receiving is the rest.
Last, a fresh ``Follower`` replays the whole log (``catch_up``, the start of every service).

The appending child reports its own CPU per append too: building a published message's headers is paid
by every writer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rallypoint.eventlog import EventLog
from rallypoint.eventlog.feeds import Delivery
from rallypoint.eventlog.log import _to_recorded
from rallypoint.events import (
    Event,
    LeaderEpochStarted,
    envelope_from_headers,
    subjects,
)
from rallypoint.events.synthetic import GPUS_PER_NODE, job_life, node_name, registered_node
from rallypoint.infra import NatsServer
from rallypoint.runtime.follower import Follower

#: Change feeds a follower feeds on every event (the scheduler's and the job controller's consumers).
CHANGE_FEEDS = 2
#: Appends in flight together by default: a burst, as a cluster's many writers make (``--in-flight 1``: one
#: event at a time, each reaching the follower alone, as a quiet cluster's do).
IN_FLIGHT = 64


@dataclass(frozen=True)
class Shape:
    """The log the bench writes: nodes, job lives of ``ranks`` ranks, appended ``in_flight`` at a time."""

    nodes: int = 500
    jobs: int = 3000
    ranks: int = 1
    in_flight: int = IN_FLIGHT

    def args(self) -> list[str]:
        counts = ("--nodes", self.nodes), ("--jobs", self.jobs), ("--ranks", self.ranks)
        return [str(part) for pair in (*counts, ("--in-flight", self.in_flight)) for part in pair]


def _life(i: int, nodes: int, ranks: int) -> list[list[Event]]:
    """Job ``i``'s events on a whole node, phase by phase."""
    node = node_name(i % nodes)
    return job_life(
        f"job-{i:06d}", node_id=node, gpus=tuple(range(GPUS_PER_NODE)), ranks=ranks, at=100.0 + i, run_s=2.0
    )


def phases(shape: Shape) -> Iterator[list[Event]]:
    """The log in groups that may be appended concurrently: a leader, the nodes, then waves of jobs
    (``in_flight`` jobs at a time, each phase of their lives after the previous one, as a cluster runs
    them; a job's node is free again by the time the next wave binds to it)."""
    yield [LeaderEpochStarted(epoch=1, leader_id="bench", at=0.0)]
    for start in range(0, shape.nodes, shape.in_flight):
        yield [registered_node(i, at=1.0) for i in range(start, min(start + shape.in_flight, shape.nodes))]
    wave = min(shape.in_flight, shape.nodes)
    for start in range(0, shape.jobs, wave):
        lives = [_life(i, shape.nodes, shape.ranks) for i in range(start, min(start + wave, shape.jobs))]
        for phase in range(len(lives[0])):
            yield [event for life in lives for event in life[phase]]


def total_events(shape: Shape) -> int:
    return sum(len(group) for group in phases(shape))


# -- the appending child ------------------------------------------------------------------------------


async def _append_all(url: str, shape: Shape) -> dict[str, float]:
    log = await EventLog.connect(url, name="followbench-writer")
    try:
        count, cpu = 0, time.process_time()
        for group in phases(shape):
            await asyncio.gather(
                *(
                    log.append(subjects.for_event(e), e, msg_id=f"{count + k}", source="followbench")
                    for k, e in enumerate(group)
                )
            )
            count += len(group)
        return {"appended": count, "append_cpu_us": (time.process_time() - cpu) / count * 1e6}
    finally:
        await log.close()


def _writer_main(url: str, shape: Shape) -> None:
    print(json.dumps(asyncio.run(_append_all(url, shape))))


# -- the follower under test ----------------------------------------------------------------------------


def _follower(log: EventLog) -> Follower:
    follower = Follower(log)
    for _ in range(CHANGE_FEEDS):
        follower.changes()
    return follower


async def _follow_live(url: str, shape: Shape) -> dict[str, Any]:
    """Follow while the child appends; this process's CPU per event over the whole run."""
    expected = total_events(shape)
    log = await EventLog.connect(url, name="followbench")
    follower = _follower(log)
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.sleep(0.2)  # the subscription is in place before the first append
        # process_time for the total (os.times counts in clock ticks, too coarse for a short run)
        start, cpu, wall = os.times(), time.process_time(), time.perf_counter()
        writer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rallypoint.bench.followbench",
            "--writer",
            url,
            *shape.args(),
            stdout=subprocess.PIPE,
        )
        while follower.state.last_seq < expected:
            await asyncio.sleep(0.05)  # a look now and then: waking on every event would add to its cost
        end, cpu, wall = os.times(), time.process_time() - cpu, time.perf_counter() - wall
        out, _ = await writer.communicate()
        written = json.loads(out)
    finally:
        task.cancel()
        await log.close()
    return {
        "events": expected,
        "follow_cpu_us_per_event": cpu / expected * 1e6,
        "follow_sys_us_per_event": (end.system - start.system) / expected * 1e6,  # of it, in the kernel
        "follow_wall_s": wall,
        "append_cpu_us_per_event": written["append_cpu_us"],
        "jobs_completed": sum(job.state == "completed" for job in follower.state.jobs.values()),
        "state_hash": follower.state.hash(),
    }


async def _capture(log: EventLog, expected: int) -> list[Delivery]:
    """Every message of the log as the follow receives it."""
    feed = await log._open_feed(1, subjects.STREAM_SUBJECTS)
    deliveries: list[Delivery] = []
    try:
        while len(deliveries) < expected:
            deliveries.extend(d for d in await feed.batch(10.0) if d.data)
    finally:
        await feed.close()
    return deliveries


def _cpu_us(work: Callable[[], object], per: int, rounds: int = 3) -> float:
    """CPU microseconds per item of ``work`` (the best of ``rounds``)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best / per * 1e6


async def _split(url: str, expected: int) -> dict[str, float]:
    """The follow path's parts, each timed alone over the same messages."""
    log = await EventLog.connect(url, name="followbench-split")
    try:
        deliveries = (await _capture(log, expected))[:expected]

        def headers() -> None:  # what reading a message's envelope costs (the projector, a trace parent)
            for d in deliveries:
                envelope_from_headers(d.header_fields())

        recs = [_to_recorded(d, True) for d in deliveries]

        def decode() -> None:
            for d in deliveries:
                _to_recorded(d, True)

        fold_cpu = float("inf")
        for _ in range(3):
            follower = _follower(log)
            start = time.process_time()
            for rec in recs:
                follower._fold(rec)
            fold_cpu = min(fold_cpu, time.process_time() - start)
        return {
            "headers_us": _cpu_us(headers, len(deliveries)),
            "decode_us": _cpu_us(decode, len(deliveries)),
            "fold_us": fold_cpu / len(recs) * 1e6,
        }
    finally:
        await log.close()


async def _replay(url: str, expected: int) -> dict[str, Any]:
    log = await EventLog.connect(url, name="followbench-replay")
    try:
        follower = _follower(log)
        cpu, wall = time.process_time(), time.perf_counter()
        await follower.catch_up()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert follower.state.last_seq == expected
        return {
            "replay_events_per_s": expected / wall,
            "replay_cpu_us_per_event": cpu / expected * 1e6,
            "replay_state_hash": follower.state.hash(),
        }
    finally:
        await log.close()


async def _measure(url: str, shape: Shape) -> dict[str, Any]:
    live = await _follow_live(url, shape)
    split = await _split(url, live["events"])
    replay = await _replay(url, live["events"])
    receive = live["follow_cpu_us_per_event"] - split["decode_us"] - split["fold_us"]
    result: dict[str, Any] = {
        "nodes": shape.nodes,
        "jobs": shape.jobs,
        "ranks_per_job": shape.ranks,
        "in_flight": shape.in_flight,
        **live,
        "split_us_per_event": {
            "receive": receive,
            # paid only by a reader of the envelope: the projector, the job traces on a JobSubmitted
            "envelope_parse_when_read": split["headers_us"],
            "decode": split["decode_us"],
            "fold": split["fold_us"],
        },
        **replay,
        "loadavg": os.getloadavg(),
    }
    return _rounded(result)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def run_bench(shape: Shape | None = None) -> dict[str, Any]:
    shape = shape or Shape()
    with (
        tempfile.TemporaryDirectory(prefix="rally-followbench-") as tmp,
        NatsServer(Path(tmp) / "nats") as server,
    ):
        return asyncio.run(_measure(server.url, shape))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--ranks", type=int, default=1, help="ranks per job (one RankExited each)")
    parser.add_argument("--in-flight", type=int, default=IN_FLIGHT, help="appends in flight together")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--writer", metavar="URL", help=argparse.SUPPRESS)  # the appending child
    args = parser.parse_args(argv)
    shape = Shape(args.nodes, args.jobs, args.ranks, args.in_flight)
    logging.getLogger("rallypoint.nats").setLevel(logging.ERROR)  # each connection's close is not news here
    if args.writer:
        _writer_main(args.writer, shape)
        return 0
    result = run_bench(shape)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
