"""Several services in one process over one fold: ``rally serve host job-controller ... :: checkpoint ...``.

Every service that folds the whole log pays, per event, for its NATS delivery, its decode and its fold:
~20 us in each process, and the server's delivery to one more consumer. The light services (the job
controller, checkpoint, preemption and inventory services, and the predictor between its runs forward)
do little else per event, so on a small machine most of their CPU is that fold. Hosted together they
fold once (``following.SharedFold``), the way Kubernetes runs its controllers in one controller manager
over shared informers.

What stays each service's own: its NATS connection and identity (so the permission matrix still decides
what each may write), its partitions and their fencing, its health port and metrics, its change feed.
What they share: the process, its event loop and its fate. When one hosted service ends, the others are
stopped too and the process exits with the worst code, so its supervisor restarts all of them: a host
never runs on with a service missing. Replicas are whole hosts (``rally up --colocate``:
docs/deployment.md says when to colocate and when not).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Sequence

from .following import sharing_one_fold
from .heap import own_heap
from .logs import setup_logging
from .priority import lower_cpu_priority
from .service import EXIT_ERROR, EXIT_OK, MainFn, ServiceConfig, run_service_async

_log = logging.getLogger("rallypoint.cohost")

#: One hosted service: its main coroutine and its own configuration (identity, health port, instance).
Hosted = tuple[MainFn, ServiceConfig]

#: Services one process may host together over one fold: those whose work per event is light beside
#: their fold, and the predictor, whose runs forward go in a thread of their own on a copy of the fold
#: (``predict.refresh``) and whose fold is otherwise idle. The API, the schedulers, the projector and the
#: health monitor (which folds the nodes' subjects only) each keep a process of their own.
HOSTABLE: tuple[str, ...] = ("job-controller", "checkpoint", "preemption", "inventory", "predictor")


def hosting_refusal(names: Sequence[str]) -> str | None:
    """Why ``names`` cannot share a host (``rally serve host``, ``--colocate``), or None: two or more of
    ``HOSTABLE``, each once."""
    for name in names:
        if name not in HOSTABLE:
            return f"cannot host {name or 'nothing'!r}: one of {', '.join(HOSTABLE)} is expected"
    if len(set(names)) != len(names):
        return f"each service once per host: {' '.join(names)}"
    if len(names) < 2:
        alone = f" (one alone: rally serve {names[0]})" if names else ""
        return f"a host runs two services or more{alone}"
    return None


def run_hosted(services: Sequence[Hosted], *, shutdown_grace: float = 10.0) -> int:
    """Run ``services`` in this process until each has returned or a signal stops them all; the first
    listed owns the shared fold (its snapshots). Returns the process exit code."""
    if not services:
        raise ValueError("a host needs at least one service")
    first = services[0][1]
    names = "+".join(config.service for _, config in services)
    setup_logging(names, first.instance, first.log_level, first.log_format)
    own_heap()
    lower_cpu_priority(host_niceness(services))
    return asyncio.run(run_hosted_async(services, shutdown_grace))


async def run_hosted_async(services: Sequence[Hosted], shutdown_grace: float = 10.0) -> int:
    """``run_hosted`` inside a running loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        _log.info("received %s; stopping every hosted service", signal.Signals(signum).name)
        stop.set()
        if signals > 1:
            for task in tasks:
                task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    services = fold_read_at_once(services)
    with sharing_one_fold(owner=services[0][1].service):
        tasks = [
            asyncio.create_task(
                _hosted(main, config, stop, shutdown_grace),
                name=f"host-{config.service}",
            )
            for main, config in services
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            unasked = not stop.is_set()
            if unasked:
                ended = next(iter(done)).get_name().removeprefix("host-")
                _log.error("%s ended; stopping the services hosted with it", ended)
            stop.set()
            codes = [await _code(task) for task in tasks]
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
    # A service that ended unasked is a failure of the host even if it returned 0: restart them all.
    return _worst(codes) or (EXIT_ERROR if unasked else EXIT_OK)


def host_niceness(services: Sequence[Hosted]) -> int:
    """One process, one CPU priority: its most urgent service's (a job controller hosted with the
    projector is still on a job's way to running; ``config.CPU_NICE``)."""
    return min(config.niceness for _, config in services)


def fold_read_at_once(services: Sequence[Hosted]) -> list[Hosted]:
    """The services, the first (whose connection carries the shared fold) paced as the least paced of
    them all (``config.READ_PACING_S``): a job controller hosted after a checkpoint service still reads
    each event as it comes."""
    (main, first), rest = services[0], list(services[1:])
    least = min(config.pacing_s for _, config in services)
    return [(main, dataclasses.replace(first, read_pacing_s=least)), *rest]


async def _hosted(main: MainFn, config: ServiceConfig, stop: asyncio.Event, shutdown_grace: float) -> int:
    # the host handles the signals once, for all of them (``on_signal``)
    return await run_service_async(
        main, config, shutdown_grace=shutdown_grace, stop=stop, handle_signals=False
    )


async def _code(task: asyncio.Task[int]) -> int:
    try:
        return await task
    except asyncio.CancelledError:
        return EXIT_ERROR


def _worst(codes: Sequence[int]) -> int:
    """The process's code: the first failure's, or 0 when all returned 0."""
    return next((code for code in codes if code != EXIT_OK), EXIT_OK)
