"""A fleet of simulated nodes served by one process: the scale harness's stand-in for thousands of agents.

One asyncio loop and one NATS connection serve many nodes, each speaking the node agent's protocol on its
own subjects, exactly as ``rallypoint.agent.node`` does: ``NodeRegistered`` appended on
``rally.node.<id>.agent`` with the same message id, heartbeats on ``hb.<id>`` every
``heartbeat_interval_s`` (spread over the period, not in one clump), ``launch`` / ``kill`` / ``status``
answered on ``cmd.agent.<id>.<verb>``, and
``RankExited`` appended for every rank with the agent's deterministic message id.

Ranks are virtual: no process is started. A rank of ``sleep N`` "runs" N seconds and exits 0, ``true``
exits 0 at once, ``false`` exits 1; anything else runs until killed (exit 143, as SIGTERM reports). So
the services see the same commands, replies and events as from real agents, and nothing else differs.

The harness silences nodes by signal: SIGUSR1 stops the heartbeats of the first ``--silence`` nodes
(only the heartbeats, the health monitor's evidence; commands are still answered), SIGUSR2 resumes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from nats.aio.msg import Msg

from rallypoint.agent.backend import gpu_infos
from rallypoint.agent.node import new_instance_id
from rallypoint.agent.sim_backend import SimulatedGpus
from rallypoint.eventlog import EventLog
from rallypoint.events import NodeRegistered, RankExited, subjects
from rallypoint.protocol import (
    GpuSample,
    Heartbeat,
    KillReply,
    KillTask,
    LaunchReply,
    LaunchTask,
    RankStatus,
    StatusReply,
)
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service

_log = logging.getLogger("rallypoint.fleet")
_json = msgspec.json.Encoder()
KILLED_EXIT = 143  # 128 + SIGTERM, what a real agent reports for a rank it stopped
# Appends of registrations and exits in flight at once: enough to hide the round trip, few enough that
# a burst does not flood the server's ack path.
APPEND_CONCURRENCY = 256
# Heartbeats go out in this many slices per period, so 12,500 nodes send a steady stream, not a clump.
HEARTBEAT_SLICES = 20
# A round of heartbeats this many intervals long is late (the process could not keep its schedule).
LATE_ROUND = 1.5
LATE_WARN_EVERY_S = 10.0
_RankKey = tuple[str, int, int]


def rank_seconds(command: Sequence[str]) -> tuple[float | None, int]:
    """How long a virtual rank of ``command`` runs (None: until killed) and the code it exits with."""
    program = Path(command[0]).name if command else ""
    if program == "sleep" and len(command) > 1:
        with contextlib.suppress(ValueError):
            return float(command[1]), 0
    if program in ("true", "false"):
        return 0.0, int(program == "false")
    return None, 0


@dataclass
class VirtualRank:
    job_id: str
    attempt: int
    rank: int
    gpus: tuple[int, ...]
    pid: int
    exit_code: int | None = None
    timer: asyncio.TimerHandle | None = None

    def status(self) -> RankStatus:
        return RankStatus(
            job_id=self.job_id, attempt=self.attempt, rank=self.rank, pid=self.pid, exit_code=self.exit_code
        )


@dataclass
class SimNode:
    node_id: str
    rack: str
    gpus: int
    instance: str = field(default_factory=new_instance_id)
    ranks: dict[_RankKey, VirtualRank] = field(default_factory=dict)
    silent: bool = False
    #: its NodeRegistered is stored: it heartbeats from then on, as an agent does right after registering
    registered: bool = False

    def busy_gpus(self) -> set[int]:
        return {g for r in self.ranks.values() if r.exit_code is None for g in r.gpus}


def _samples(gpus: int, busy: set[int]) -> tuple[GpuSample, ...]:
    return tuple(
        GpuSample(
            index=i,
            temperature_c=70.0 if i in busy else 40.0,
            utilization=95.0 if i in busy else 0.0,
            memory_used_mib=60_000 if i in busy else 0,
        )
        for i in range(gpus)
    )


class Fleet:
    """Many simulated nodes on one event log connection. ``await start()``, then ``await close()``."""

    def __init__(
        self,
        log: EventLog,
        nodes: Sequence[SimNode],
        *,
        heartbeat_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = log
        self.nodes = {n.node_id: n for n in nodes}
        self.heartbeat_interval_s = heartbeat_interval_s
        self.clock = clock
        self._exits: asyncio.Queue[tuple[SimNode, VirtualRank]] = asyncio.Queue()
        self._pids = itertools.count(100_000)
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = {n: _samples(n, set()) for n in {node.gpus for node in nodes}}
        self.heartbeats_sent = 0
        self.late_rounds = 0
        self._late_warned = -LATE_WARN_EVERY_S

    async def start(self) -> None:
        # Heartbeats start with the registrations, each node's right after its own is stored: under
        # load, registering 3,125 nodes takes seconds, and the first ones registered would otherwise
        # stay silent past the monitor's timeout.
        self._tasks = [asyncio.create_task(self._heartbeat_loop())]
        await self.register_all()
        nc = self.log.nc
        # Each node's own commands only, as its agent subscribes: a wildcard over every node would have
        # the server deliver each command to every fleet, and every fleet decode it, for one to answer.
        handlers = {"launch": self._launch, "kill": self._kill, "status": self._status}
        callback = self._guarded(handlers)
        for node_id in self.nodes:
            await nc.subscribe(subjects.agent_commands(node_id), cb=callback)
        await nc.flush()
        self._tasks += [asyncio.create_task(self._report_loop()) for _ in range(APPEND_CONCURRENCY // 4)]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def silence(self, count: int, silent: bool = True) -> int:
        """Stop (or resume) the heartbeats of the first ``count`` nodes; returns how many changed."""
        chosen = list(self.nodes.values())[:count]
        for node in chosen:
            node.silent = silent
        return len(chosen)

    # -- log writes ---------------------------------------------------------------------------------

    async def register_all(self) -> None:
        semaphore = asyncio.Semaphore(APPEND_CONCURRENCY)

        async def one(node: SimNode) -> None:
            async with semaphore:
                await self._register(node)

        await asyncio.gather(*(one(n) for n in self.nodes.values()))

    async def _register(self, node: SimNode) -> None:
        backend = SimulatedGpus(node.node_id, node.gpus)
        event = NodeRegistered(
            node_id=node.node_id,
            address="127.0.0.1",
            rack=node.rack,
            spine="spine-0",
            gpu_type=backend.gpu_type,
            gpus=gpu_infos(backend),
            cpu_milli=64_000,
            memory_mib=512 * 1024,
            agent_instance=node.instance,
            at=self.clock(),
        )
        msg_id = f"{node.node_id}:{node.instance}:NodeRegistered"
        await self._append_until_stored(subjects.for_event(event), event, msg_id)
        node.registered = True
        if not node.silent:
            await self._beat(node)  # its first heartbeat at once, as an agent's

    async def _append_until_stored(
        self, subject: str, event: NodeRegistered | RankExited, msg_id: str
    ) -> None:
        delay = 0.1
        while True:
            try:
                await self.log.append(subject, event, msg_id=msg_id, source="rallypoint/fleet")
                return
            except Exception as exc:  # as the agent: the event must land; the msg id makes retries safe
                _log.warning("append %s failed (%s); retrying in %.1fs", msg_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _report_loop(self) -> None:
        while True:
            node, rank = await self._exits.get()
            event = RankExited(
                job_id=rank.job_id,
                attempt=rank.attempt,
                rank=rank.rank,
                node_id=node.node_id,
                exit_code=rank.exit_code if rank.exit_code is not None else 0,
                at=self.clock(),
            )
            msg_id = f"{rank.job_id}:{rank.attempt}:RankExited:{rank.rank}"
            await self._append_until_stored(subjects.for_event(event), event, msg_id)

    # -- heartbeats ---------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        nodes = list(self.nodes.values())
        tick = self.heartbeat_interval_s / HEARTBEAT_SLICES
        round_started = time.monotonic()
        for slot in itertools.cycle(range(HEARTBEAT_SLICES)):
            started = time.monotonic()
            for node in nodes[slot::HEARTBEAT_SLICES]:
                if node.registered and not node.silent:
                    await self._beat(node)
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
            if slot == HEARTBEAT_SLICES - 1:
                self._note_round(time.monotonic() - round_started)
                round_started = time.monotonic()

    def _note_round(self, took_s: float) -> None:
        """A round of every node's heartbeat that took far longer than the interval means this process,
        starved, spaced its nodes' heartbeats out: the monitor may rightly find them silent, which no real
        node (one agent per machine) shares. Said loudly, so a bench tells that from a misjudgement."""
        if took_s <= LATE_ROUND * self.heartbeat_interval_s:
            return
        self.late_rounds += 1
        now = time.monotonic()
        if now - self._late_warned >= LATE_WARN_EVERY_S:
            _log.warning(
                "heartbeats behind schedule: a round of %d nodes took %.1f s (interval %.1f s; %d late)",
                len(self.nodes),
                took_s,
                self.heartbeat_interval_s,
                self.late_rounds,
            )
            self._late_warned = now

    async def _beat(self, node: SimNode) -> None:
        busy = node.busy_gpus()
        beat = Heartbeat(
            node_id=node.node_id,
            agent_instance=node.instance,
            at=self.clock(),
            gpus=_samples(node.gpus, busy) if busy else self._idle[node.gpus],
            ranks=tuple(r.status() for r in node.ranks.values() if r.exit_code is None),
        )
        await self.log.nc.publish(subjects.heartbeat(node.node_id), _json.encode(beat))
        self.heartbeats_sent += 1

    # -- commands -----------------------------------------------------------------------------------

    def _guarded(
        self, handlers: Mapping[str, Callable[[SimNode, Msg], bytes]]
    ) -> Callable[[Msg], Awaitable[None]]:
        async def callback(msg: Msg) -> None:
            tokens = msg.subject.split(".")
            node, verb = self.nodes.get(tokens[2]), tokens[3]
            handler = handlers.get(verb)
            if node is None:
                return
            try:
                reply = (
                    handler(node, msg)
                    if handler is not None  # logs, tty: a real agent's, of ranks a virtual one has not
                    else _json.encode({"ok": False, "error": f"a simulated node does not serve {verb!r}"})
                )
            except Exception as exc:
                _log.exception("command on %s failed", msg.subject)
                reply = _json.encode({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            if msg.reply:
                await msg.respond(reply)

        return callback

    def _launch(self, node: SimNode, msg: Msg) -> bytes:
        task = msgspec.json.decode(msg.data, type=LaunchTask)
        if task.node_id != node.node_id or not task.command:
            return _json.encode(LaunchReply(ok=False, error=f"bad task for {node.node_id}"))
        seconds, code = rank_seconds(task.command)
        started: list[int] = []
        already: list[int] = []
        for spec in task.ranks:
            key = (task.job_id, task.attempt, spec.rank)
            if key in node.ranks:
                already.append(spec.rank)
                continue
            rank = VirtualRank(task.job_id, task.attempt, spec.rank, spec.gpus, next(self._pids))
            node.ranks[key] = rank
            started.append(spec.rank)
            if seconds is not None:
                loop = asyncio.get_running_loop()
                rank.timer = loop.call_later(seconds, self._finish, node, rank, code)
        reply = LaunchReply(
            ok=True,
            already_running=not started and bool(already),
            started=tuple(started),
            already=tuple(already),
        )
        return _json.encode(reply)

    def _finish(self, node: SimNode, rank: VirtualRank, code: int) -> None:
        if rank.exit_code is not None:
            return
        rank.exit_code = code
        self._exits.put_nowait((node, rank))

    def _kill(self, node: SimNode, msg: Msg) -> bytes:
        kill = msgspec.json.decode(msg.data, type=KillTask)
        signalled = 0
        for rank in node.ranks.values():
            if (rank.job_id, rank.attempt) == (kill.job_id, kill.attempt) and rank.exit_code is None:
                if rank.timer is not None:
                    rank.timer.cancel()
                self._finish(node, rank, KILLED_EXIT)
                signalled += 1
        return _json.encode(KillReply(ok=True, signalled=signalled))

    def _status(self, node: SimNode, _msg: Msg) -> bytes:
        ranks = tuple(r.status() for r in node.ranks.values())
        return _json.encode(StatusReply(node_id=node.node_id, agent_instance=node.instance, ranks=ranks))


# -- the process ------------------------------------------------------------------------------------


def rack_of(index: int, nodes: int, racks: int) -> str:
    """The rack of node ``index`` (0-based) of ``nodes``: as ``LocalCluster.rack_of`` cables them."""
    return f"rack-{index * racks // nodes + 1}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.agent.fleet", description=__doc__)
    add_common_args(parser)
    parser.add_argument("--first", type=int, required=True, help="1-based index of this fleet's first node")
    parser.add_argument("--count", type=int, required=True, help="nodes this process serves")
    parser.add_argument("--total", type=int, required=True, help="nodes in the whole cluster (racks)")
    parser.add_argument("--racks", type=int, default=1, help="racks in the whole cluster")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between heartbeats")
    parser.add_argument("--silence", type=int, default=0, help="nodes SIGUSR1 silences (SIGUSR2 resumes)")
    parser.add_argument("--ready-file", type=Path, required=True, help="written once every node is up")
    return parser


def fleet_nodes(args: argparse.Namespace) -> list[SimNode]:
    indexes = range(args.first - 1, args.first - 1 + args.count)
    return [SimNode(f"node-{i + 1}", rack_of(i, args.total, args.racks), args.gpus) for i in indexes]


async def fleet_main(ctx: ServiceContext, args: argparse.Namespace) -> int:
    fleet = Fleet(await ctx.event_log(), fleet_nodes(args), heartbeat_interval_s=args.heartbeat_interval)
    loop = asyncio.get_running_loop()

    def silence(silent: bool) -> None:
        _log.info("silent=%s: %d nodes at %.3f", silent, fleet.silence(args.silence, silent), time.time())

    loop.add_signal_handler(signal.SIGUSR1, silence, True)
    loop.add_signal_handler(signal.SIGUSR2, silence, False)
    await fleet.start()
    args.ready_file.write_text(f"{time.time()}\n")
    _log.info("fleet of %d nodes up", len(fleet.nodes))
    try:
        await ctx.stop.wait()
    finally:
        await fleet.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = ServiceConfig.from_args("fleet", args)
    return run_service(lambda ctx: fleet_main(ctx, args), config)


if __name__ == "__main__":
    raise SystemExit(main())
