"""The node agent: registers its node, heartbeats, serves launch/kill/status/logs, and reports rank exits.

What it writes to the log is only what it alone knows: ``NodeRegistered`` (its hardware),
``RankExited`` (how each rank ended) and ``CheckpointCommitted`` (what its ranks reported through
their report files, see ``reports``). Everything else it does is answering commands.

Order: a rank's ``CheckpointCommitted`` is in the log before its ``RankExited`` (a preempted rank
saves, commits and exits 0; whoever accounts lost work after the exits must already see the commit).
Each watch pass polls the exits first, then reads the report files and appends their commits, and
only then queues the exits: a rank writes its line before it exits, so the line is on disk by the time
its exit is seen.

Guarantee: a ``RankExited`` is never lost. The wrapper writes the exit code to disk before anyone is
told; the agent appends it with a deterministic ``Nats-Msg-Id`` (``<job>:<attempt>:RankExited:<rank>``),
retrying on every failure, and only then marks it reported on disk. If the agent dies in between, the
restarted agent finds the unreported exit file and appends again; the log's duplicate window (2 min)
absorbs the retry, and the event is keyed by (job, attempt, rank) so a consumer folding a late
duplicate is idempotent anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rallypoint.agent.backend import GpuBackend, gpu_infos
from rallypoint.agent.launcher import RankExit, RankLauncher
from rallypoint.agent.logs import read_log_chunk
from rallypoint.agent.reports import CHECKPOINT_FIELDS as CHECKPOINT_FIELDS
from rallypoint.agent.reports import ReportBatch, ReportSource, ReportTail
from rallypoint.agent.sim_backend import SimulatedGpus
from rallypoint.agent.slowdown import DutyCycler, LauncherGroups
from rallypoint.agent.terminal import TerminalRelay
from rallypoint.eventlog import AppendConflict, EventLog
from rallypoint.events import CheckpointCommitted, NodeRegistered, RankExited, subjects
from rallypoint.observability.instruments import HEARTBEATS_SENT, RANK_LAUNCHES
from rallypoint.observability.tracing import SpanKind, context_from_headers, record_span, span
from rallypoint.protocol import (
    REFUSED_BAD_REQUEST,
    REFUSED_EMPTY_COMMAND,
    REFUSED_SUPERSEDED,
    REFUSED_UNKNOWN_GPUS,
    REFUSED_WRONG_NODE,
    Heartbeat,
    KillReply,
    KillTask,
    LaunchReply,
    LaunchTask,
    LogsReply,
    LogsRequest,
    RankStatus,
    StatusReply,
    TerminalReply,
    TerminalRequest,
)

_log = logging.getLogger(__name__)

# A rank whose report file cannot be read has its exit held back this long (the commit it may hold
# must go first), then reported anyway: an exit is never held hostage by an unreadable file.
EXIT_HOLD_S = 5.0
_RankKey = tuple[str, int, int]
_json = msgspec.json.Encoder()


def _attrs(task: LaunchTask) -> dict[str, Any]:
    return {"rally.job_id": task.job_id, "rally.attempt": task.attempt, "rally.node_id": task.node_id}


def new_instance_id() -> str:
    """A fresh id per agent process: tells a restarted agent's registration and heartbeats apart."""
    return secrets.token_hex(6)


def host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    rack: str = "rack-0"
    spine: str = "spine-0"
    address: str = "127.0.0.1"
    cpu_milli: int | None = None  # default: this host's CPUs
    memory_mib: int | None = None  # default: this host's RAM
    labels: dict[str, str] = field(default_factory=dict)  # what jobs' node_selector match (``--label``)
    taints: tuple[str, ...] = ()  # only jobs tolerating all of them run here (``--taint``)
    heartbeat_interval_s: float = 1.0
    poll_interval_s: float = 0.2
    instance: str = field(default_factory=new_instance_id)

    @property
    def source(self) -> str:
        return f"rallypoint/agent/{self.node_id}"


class NodeAgent:
    """One node's agent. ``await start()``, then ``await close()``; or ``await run(stop_event)``."""

    def __init__(
        self,
        log: EventLog,
        backend: GpuBackend,
        launcher: RankLauncher,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Validate the node id once, up front: it becomes a subject token and a msg-id prefix.
        subjects.node_registration(config.node_id)
        self.log = log
        self.backend = backend
        self.launcher = launcher
        self.config = config
        self._clock = clock
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._reports: asyncio.Queue[RankExit] = asyncio.Queue()
        self._tail = ReportTail(config.node_id, clock=clock)
        self._held: dict[_RankKey, tuple[RankExit, float]] = {}
        self.registered_seq: int | None = None
        self.heartbeats_sent = 0
        # Makes a backend's slowdown factor real on this node's ranks (a simulated straggler).
        self.slowdown = DutyCycler(LauncherGroups(launcher))
        self.terminals: TerminalRelay | None = None  # interactive ranks' terminals, once started

    @property
    def node_id(self) -> str:
        return self.config.node_id

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.register()
        nc = self.log.nc
        self.terminals = TerminalRelay(nc, self.node_id, self.launcher)
        self.terminals.start()
        handlers = (
            ("launch", self._on_launch),
            ("kill", self._on_kill),
            ("status", self._on_status),
            ("logs", self._on_logs),
            ("tty", self._on_tty),
        )
        for verb, handler in handlers:
            self._subs.append(
                await nc.subscribe(
                    subjects.agent_command(self.node_id, verb), cb=self._guarded(verb, handler)
                )
            )
        # Make sure the server has our subscriptions before anyone is told we are up.
        await nc.flush()
        self.slowdown.start()
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name=f"agent-{self.node_id}-heartbeat"),
            asyncio.create_task(self._watch_loop(), name=f"agent-{self.node_id}-watch"),
            asyncio.create_task(self._report_loop(), name=f"agent-{self.node_id}-report"),
        ]
        _log.info(
            "agent %s (%s) up: %d GPUs of %s, work dir %s",
            self.node_id,
            self.config.instance,
            len(self.backend.inventory()),
            self.backend.gpu_type,
            self.launcher.work_dir,
        )

    async def close(self) -> None:
        """Stop serving. Running ranks keep running; unreported exits stay on disk for the next start."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.terminals is not None:
            await self.terminals.close()
        # Never leave a rank stopped behind us: the cycler continues whatever it stopped.
        await asyncio.to_thread(self.slowdown.close)

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()

    # -- log writes ---------------------------------------------------------------------------------

    async def register(self) -> int:
        cfg = self.config
        event = NodeRegistered(
            node_id=cfg.node_id,
            address=cfg.address,
            rack=cfg.rack,
            spine=cfg.spine,
            gpu_type=self.backend.gpu_type,
            gpus=gpu_infos(self.backend),
            cpu_milli=cfg.cpu_milli if cfg.cpu_milli is not None else (os.cpu_count() or 1) * 1000,
            memory_mib=cfg.memory_mib if cfg.memory_mib is not None else host_memory_mib(),
            agent_instance=cfg.instance,
            at=self._clock(),
            labels=dict(cfg.labels),
            taints=tuple(sorted(set(cfg.taints))),
        )
        self.registered_seq = await self._append_until_stored(
            subjects.for_event(event), event, f"{cfg.node_id}:{cfg.instance}:NodeRegistered"
        )
        return self.registered_seq

    async def report(self, exit: RankExit) -> int:
        """Append RankExited for one rank, retrying until it is stored, then mark it reported on disk."""
        event = RankExited(
            job_id=exit.job_id,
            attempt=exit.attempt,
            rank=exit.rank,
            node_id=self.node_id,
            exit_code=exit.exit_code,
            at=exit.at,
        )
        seq = await self._append_until_stored(
            subjects.for_event(event), event, f"{exit.job_id}:{exit.attempt}:RankExited:{exit.rank}"
        )
        await asyncio.to_thread(self.launcher.mark_reported, exit)
        _log.info(
            "rank %d of %s attempt %d exited with %d (seq %d)",
            exit.rank,
            exit.job_id,
            exit.attempt,
            exit.exit_code,
            seq,
        )
        return seq

    async def report_checkpoint(self, event: CheckpointCommitted) -> int:
        """Append a rank's reported commit, retrying until it is stored (one message id per step)."""
        seq = await self._append_until_stored(
            subjects.for_event(event), event, f"{event.job_id}:ckpt:{event.step}"
        )
        _log.info("%s committed checkpoint step %d (seq %d)", event.job_id, event.step, seq)
        return seq

    async def _append_until_stored(
        self, subject: str, event: NodeRegistered | RankExited | CheckpointCommitted, msg_id: str
    ) -> int:
        delay = 0.1
        while True:
            try:
                return await self.log.append(subject, event, msg_id=msg_id, source=self.config.source)
            except AppendConflict:
                raise  # unconditional appends cannot conflict; if one does, it is a bug worth seeing
            except Exception as exc:
                # LogUnavailable above all, but anything else too (stream briefly missing during a server
                # restart): the event must land eventually, and the same msg_id makes retries safe.
                _log.warning(
                    "append %s failed (%s: %s); retrying in %.1fs", msg_id, type(exc).__name__, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- loops --------------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                await self.heartbeat()
            except Exception as exc:
                # A missed heartbeat is survivable (the monitor tolerates a few); a dead loop is not.
                _log.warning("heartbeat failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.config.heartbeat_interval_s)

    async def heartbeat(self) -> Heartbeat:
        if isinstance(self.backend, SimulatedGpus):
            busy = self.launcher.busy_gpus()
            self.backend.set_busy(range(len(self.backend.inventory())), False)
            self.backend.set_busy(busy, True)
        gpus = await asyncio.to_thread(self.backend.sample)
        nics = await asyncio.to_thread(self.backend.nics)
        self.slowdown.set_factor(self.backend.slowdown())
        ranks = tuple(self._with_progress(r) for r in self.launcher.status() if r.exit_code is None)
        beat = Heartbeat(
            node_id=self.node_id,
            agent_instance=self.config.instance,
            at=self._clock(),
            gpus=gpus,
            ranks=ranks,
            nics=nics,
        )
        # Core NATS, fire and forget: a heartbeat is telemetry, the next one supersedes it.
        await self.log.nc.publish(subjects.heartbeat(self.node_id), _json.encode(beat))
        self.heartbeats_sent += 1
        HEARTBEATS_SENT.inc()
        return beat

    def _with_progress(self, rank: RankStatus) -> RankStatus:
        progress = self._tail.progress.get((rank.job_id, rank.attempt, rank.rank))
        if progress is None:
            return rank
        return msgspec.structs.replace(
            rank, step=progress.step, step_time_s=progress.step_time_s, progress_at=progress.at
        )

    async def _watch_loop(self) -> None:
        while True:
            try:
                await self.watch_once()
            except Exception:
                _log.exception("polling ranks failed")
            await asyncio.sleep(self.config.poll_interval_s)

    async def watch_once(self) -> None:
        """One pass: reap and collect exits, append the reports' new commits, then queue the exits."""
        now = time.monotonic()
        for exit in await asyncio.to_thread(self.launcher.poll):
            self._held[(exit.job_id, exit.attempt, exit.rank)] = (exit, now)
        unread = await self.read_reports()
        for key, (exit, since) in list(self._held.items()):
            if key in unread and now - since < EXIT_HOLD_S:
                continue
            del self._held[key]
            self._reports.put_nowait(exit)

    async def read_reports(self) -> set[_RankKey]:
        """Append the commits reported since the last pass; the ranks whose file could not be read."""
        sources = await asyncio.to_thread(self.launcher.report_sources)
        batches, unread = await asyncio.to_thread(self._read_all, sources)
        for batch in batches:
            for event in batch.commits:
                await self.report_checkpoint(event)
        await asyncio.to_thread(self._advance_all, batches)
        return unread

    def _read_all(self, sources: list[ReportSource]) -> tuple[list[ReportBatch], set[_RankKey]]:
        self._tail.retain(sources)
        batches: list[ReportBatch] = []
        unread: set[_RankKey] = set()
        for source in sources:
            try:
                batches.append(self._tail.read(source))
            except OSError as exc:
                _log.warning("cannot read %s: %s", source.path, exc)
                unread.add(source.key)
        return batches, unread

    def _advance_all(self, batches: list[ReportBatch]) -> None:
        for batch in batches:
            try:
                self._tail.advance(batch)
            except OSError as exc:
                # The commits are in the log; a restart re-reads them and re-appends with the same ids.
                _log.warning("cannot save the read offset of %s: %s", batch.source.path, exc)

    async def _report_loop(self) -> None:
        while True:
            exit = await self._reports.get()
            try:
                await self.report(exit)
            except Exception:
                # Still on disk and unreported: requeue so this process retries; a restart would too.
                _log.exception("reporting %s failed; requeued", exit)
                await asyncio.sleep(1.0)
                self._reports.put_nowait(exit)

    # -- commands -----------------------------------------------------------------------------------

    def _guarded(
        self, verb: str, handler: Callable[[Msg], Awaitable[bytes]]
    ) -> Callable[[Msg], Awaitable[None]]:
        async def callback(msg: Msg) -> None:
            try:
                reply = await handler(msg)
            except Exception as exc:
                _log.exception("command %s failed", verb)
                reply = _json.encode({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            if msg.reply:
                await msg.respond(reply)

        return callback

    async def _on_launch(self, msg: Msg) -> bytes:
        try:
            task = msgspec.json.decode(msg.data, type=LaunchTask)
        except msgspec.DecodeError as exc:
            return _json.encode(
                LaunchReply(ok=False, error=f"bad LaunchTask: {exc}", code=REFUSED_BAD_REQUEST)
            )
        if task.node_id != self.node_id:
            error = f"task is for node {task.node_id}, this is {self.node_id}"
            return _json.encode(LaunchReply(ok=False, error=error, code=REFUSED_WRONG_NODE))
        if not task.command:
            return _json.encode(LaunchReply(ok=False, error="empty command", code=REFUSED_EMPTY_COMMAND))
        known = {d.index for d in self.backend.inventory()}
        if missing := sorted({g for r in task.ranks for g in r.gpus} - known):
            error = f"no such GPUs on {self.node_id}: {missing}"
            return _json.encode(LaunchReply(ok=False, error=error, code=REFUSED_UNKNOWN_GPUS))
        parent = context_from_headers(msg.headers)  # the job controller's launch span
        with span("agent.launch", parent, kind=SpanKind.SERVER, attributes=_attrs(task)):
            outcome = await asyncio.to_thread(self.launcher.launch, task)
            if outcome.superseded_by is not None:
                newer, job = outcome.superseded_by, task.job_id
                error = f"attempt {newer} of {job} runs here; attempt {task.attempt} is over"
                return _json.encode(LaunchReply(ok=False, error=error, code=REFUSED_SUPERSEDED))
            now = self._clock()
            for rank in outcome.started:  # one span per rank it started, in the job's trace
                started = {"rally.rank": rank}
                record_span(f"rank {rank} running", None, start_s=now, end_s=now, attributes=started)
        RANK_LAUNCHES.labels(result="already_running" if outcome.already_running else "started").inc()
        _log.info(
            "launch %s attempt %d: started ranks %s, already %s%s",
            task.job_id,
            task.attempt,
            list(outcome.started),
            list(outcome.already),
            "".join(f"; stopped stale {job} attempt {attempt} first" for job, attempt in outcome.evicted),
        )
        return _json.encode(
            LaunchReply(
                ok=True,
                already_running=outcome.already_running,
                started=outcome.started,
                already=outcome.already,
            )
        )

    async def _on_kill(self, msg: Msg) -> bytes:
        try:
            kill = msgspec.json.decode(msg.data, type=KillTask)
        except msgspec.DecodeError as exc:
            return _json.encode(KillReply(ok=False, error=f"bad KillTask: {exc}"))
        signalled = await asyncio.to_thread(self.launcher.kill, kill.job_id, kill.attempt, kill.grace_s)
        self.slowdown.wake()  # a stopped rank gets its SIGTERM only once it runs again
        _log.info(
            "kill %s attempt %d (grace %.1fs): %d ranks", kill.job_id, kill.attempt, kill.grace_s, signalled
        )
        return _json.encode(KillReply(ok=True, signalled=signalled))

    async def _on_logs(self, msg: Msg) -> bytes:
        try:
            request = msgspec.json.decode(msg.data, type=LogsRequest)
        except msgspec.DecodeError as exc:
            return _json.encode(LogsReply(ok=False, error=f"bad LogsRequest: {exc}"))
        return _json.encode(await asyncio.to_thread(read_log_chunk, self.launcher.work_dir, request))

    async def _on_tty(self, msg: Msg) -> bytes:
        try:
            request = msgspec.json.decode(msg.data, type=TerminalRequest)
        except msgspec.DecodeError as exc:
            return _json.encode(TerminalReply(ok=False, error=f"bad TerminalRequest: {exc}"))
        if self.terminals is None:
            return _json.encode(TerminalReply(ok=False, error="the agent is not serving yet"))
        return _json.encode(await self.terminals.handle(request))

    async def _on_status(self, msg: Msg) -> bytes:
        ranks = await asyncio.to_thread(self.launcher.status)
        reply = StatusReply(node_id=self.node_id, agent_instance=self.config.instance, ranks=ranks)
        return _json.encode(reply)
