"""The service shell (GUIDE §4.7): signals -> an Event, connections owned by an AsyncExitStack,
drain on exit, an exit code. Services put their logic in libs/ and only wire it up here.

    async def main(ctx: ServiceContext) -> int:
        log = await ctx.event_log()
        async for rec in log.follow(from_seq=1):
            ...
            if ctx.stopping:
                break
        return 0

    sys.exit(run_service(main, ServiceConfig.from_args("inventory", args)))
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js.client import JetStreamContext

from rallypoint.eventlog import EventLog, SnapshotStore, connect_nats
from rallypoint.eventlog.connection import FastHeadersClient, without_password
from rallypoint.eventlog.pacing import ReadPacing
from rallypoint.observability.tracing import setup_tracing

from .config import ServiceConfig, nats_servers
from .health import serve_health
from .heap import own_heap
from .leader import LEADER_BUCKET, LeaderLease
from .logs import setup_logging
from .priority import lower_cpu_priority
from .reports import set_leadership

_log = logging.getLogger("rallypoint.runtime")

T = TypeVar("T")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class ServiceContext:
    """What a service's main coroutine gets: its config, the stop signal and shared connections."""

    def __init__(self, config: ServiceConfig, stop: asyncio.Event, stack: AsyncExitStack) -> None:
        self.config = config
        self.stop = stop
        self.stack = stack
        self._nc: Client | None = None
        self._lease_nc: Client | None = None
        self._event_log: EventLog | None = None

    @property
    def stopping(self) -> bool:
        return self.stop.is_set()

    @property
    def nats_client(self) -> Client | None:
        """The connection if the service opened one (health checks must not open it)."""
        return self._nc

    @property
    def name(self) -> str:
        return f"{self.config.service}/{self.config.instance}"

    @property
    def role(self) -> str:
        """The service's role in the permission matrix (``rallypoint.security.permissions``): what it may
        write, and whose snapshot is its own."""
        return self.config.service

    async def nats(self, *, initial_timeout: float | None = None) -> Client:
        """The service's one NATS connection (created on first use, drained on exit).

        ``initial_timeout=None`` waits for the server forever: a service may start before NATS does.
        """
        if self._nc is None:
            self._nc = await self._connect(self.name, initial_timeout, self.config.pacing_s)
        return self._nc

    async def _connect(self, name: str, initial_timeout: float | None, read_pacing_s: float) -> Client:
        """A connection of the service's identity, drained when the service exits."""
        nc = await connect_nats(
            nats_servers(self.config.nats_url),
            name=name,
            initial_timeout=initial_timeout,
            credentials=self.config.nats_credentials,
            read_pacing_s=read_pacing_s,
        )
        self.stack.push_async_callback(_drain, nc)
        return nc

    @property
    def read_pacing(self) -> ReadPacing | None:
        """The connection's read pacing (None before it opens, or on a client without it)."""
        return self._nc.pacing if isinstance(self._nc, FastHeadersClient) else None

    async def jetstream(self) -> JetStreamContext:
        return (await self.nats()).jetstream()

    async def lease_jetstream(self) -> JetStreamContext:
        """JetStream on a second connection of the service's own, for its leases and partition keys alone.

        A lease is lost when its renewal is not answered within 0.8 of its TTL. On the service's main
        connection that answer queues behind every event delivered before it: a burst of thousands of
        binds for the job controller to fold and launch held its renewals' answers for over a second on a
        busy machine, and it dropped all 32 partitions in the middle of the burst. On a connection that
        carries nothing else, the answer is read as soon as the loop turns, between two reads of the
        burst. Opened on first use, drained on exit (after the leases resign, which register later)."""
        if self._lease_nc is None:
            self._lease_nc = await self._connect(f"{self.name}/leases", None, 0.0)
        return self._lease_nc.jetstream()

    async def event_log(self, *, create: bool = False, replicas: int | None = None) -> EventLog:
        """The log, on the service's connection. Services never create or reconfigure the stream (the admin
        identity sets it up: ``rally nats setup``; their NATS users may not), so a missing one fails here."""
        if self._event_log is None:
            count = self.config.replicas if replicas is None else replicas
            self._event_log = await EventLog.attach(await self.nats(), create=create, replicas=count)
        return self._event_log

    async def snapshots(self) -> SnapshotStore:
        """This role's own snapshot store (made by ``rally nats setup``; by us on an open test server)."""
        return await SnapshotStore.open(await self.jetstream(), self.role)

    async def leader_lease(
        self, *, key: str | None = None, ttl: float = 3.0, bucket: str = LEADER_BUCKET
    ) -> LeaderLease:
        lease = await LeaderLease.open(
            await self.lease_jetstream(),
            key=key or self.config.service,
            holder=self.config.instance,
            ttl=ttl,
            bucket=bucket,
        )
        # Registered after the connection's drain, so it runs before it (LIFO): resign while connected.
        self.stack.push_async_callback(lease.resign)
        # /healthz's `leader` and /metrics' rally_leader: which replica leads (every replica says ok).
        set_leadership(self, lease.key, lambda: lease.is_leader)
        return lease

    async def until_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """Await something, or give up (None) when the service is asked to stop."""
        task = asyncio.ensure_future(awaitable)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    async def iterate(self, source: AsyncIterator[T]) -> AsyncIterator[T]:
        """Iterate ``source`` until it ends or the service is asked to stop."""
        while not self.stopping:
            try:
                item = await self.until_stopped(anext(source))
            except StopAsyncIteration:
                return
            if item is None and self.stopping:
                return
            yield item  # type: ignore[misc]  # None only when stopping, handled above


async def _drain(nc: Client) -> None:
    if nc.is_closed:
        return
    # Drain flushes our pending publishes and lets in-flight messages finish; a dead server must
    # not turn shutdown into an error.
    with contextlib.suppress(Exception):
        await nc.drain()
    if not nc.is_closed:
        with contextlib.suppress(Exception):
            await nc.close()


MainFn = Callable[[ServiceContext], Coroutine[Any, Any, int | None]]


def run_service(
    main: MainFn, config: ServiceConfig, *, shutdown_grace: float = 10.0, configure_logging: bool = True
) -> int:
    """Run ``main`` until it returns or SIGINT/SIGTERM arrives; returns the process exit code.

    On a signal ``ctx.stop`` is set and ``main`` has ``shutdown_grace`` seconds to return on its own
    (finish the current step, append nothing half-done); then it is cancelled. A second signal cancels
    at once. Connections close (drain) after ``main`` has finished, in reverse order of opening.
    """
    if configure_logging:
        setup_logging(config.service, config.instance, config.log_level, config.log_format)
    own_heap()  # this process is the service's own: its fold may settle the collector (runtime.heap)
    lower_cpu_priority(config.niceness)  # before any thread starts: each inherits it
    return asyncio.run(run_service_async(main, config, shutdown_grace=shutdown_grace))


async def run_service_async(
    main: MainFn,
    config: ServiceConfig,
    *,
    shutdown_grace: float = 10.0,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
) -> int:
    """``run_service`` inside a running loop (tests pass their own ``stop`` event; a process hosting
    several services handles the signals once for all of them: ``handle_signals=False``)."""
    setup_tracing(config.service, config.instance)  # off unless an OTLP endpoint is configured
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    signals = 0
    main_task: asyncio.Task[int | None] | None = None

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        _log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()
        if signals > 1 and main_task is not None:
            main_task.cancel()

    installed: list[int] = []
    for signum in (int(signal.SIGINT), int(signal.SIGTERM)) if handle_signals else ():
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests) or not a Unix loop: rely on `stop` alone

    code = EXIT_OK
    try:
        async with AsyncExitStack() as stack:
            ctx = ServiceContext(config, stop, stack)
            _log.info("starting %s (nats %s)", ctx.name, without_password(config.nats_url))
            main_task = asyncio.create_task(main(ctx), name=f"{config.service}-main")
            if config.health_port is not None:
                await serve_health(ctx, main_task, config.health_port)
            stop_wait = asyncio.create_task(stop.wait())
            await asyncio.wait({main_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not main_task.done():
                done, _ = await asyncio.wait({main_task}, timeout=shutdown_grace)
                if not done:
                    _log.warning(
                        "main did not return within %.1fs of the stop signal; cancelling", shutdown_grace
                    )
                    main_task.cancel()
            stop_wait.cancel()
            try:
                result = await main_task
                code = EXIT_OK if result is None else int(result)
            except asyncio.CancelledError:
                code = EXIT_INTERRUPTED if signals else EXIT_ERROR
            except Exception:
                _log.exception("%s failed", ctx.name)
                code = EXIT_ERROR
    except Exception:
        _log.exception("shutdown of %s/%s failed", config.service, config.instance)
        code = code or EXIT_ERROR
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
    _log.info("stopped %s/%s with exit code %d", config.service, config.instance, code)
    return code
