"""Shared fixtures: real servers on free ports, started once per test session.

- ``nats_server``: a ``NatsServer`` (JetStream) on a free port with a temporary store; session scope.
- ``postgres``: a ``PostgresServer`` with database ``rallypoint``; session scope, started on first use.
- ``event_log``: an ``EventLog`` on the session server, with the ``RALLY`` stream created fresh for
  the test and deleted afterwards, so every test starts from an empty log at sequence 0.

Stream names must not overlap in subjects (all use ``rally.>``), so tests that use ``event_log`` must
not create another ``rally.>`` stream on the same server at the same time; tests that need their own
server start one (``NatsServer`` is ~50 ms).

``make test`` runs the suite on several pytest-xdist workers, a module to a worker (``--dist loadscope``),
so a module's fixtures are made once; each worker has its own session servers. The modules that start
whole clusters come first (see ``pytest_collection_modifyitems``) so that the long ones do not end the run
alone on one worker while the others sit idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import time
from collections.abc import AsyncIterator, Iterator

import nats.js.errors
import pytest
from nats.aio.client import Client

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.infra import NatsServer, PostgresServer

# The order the workers take modules in: the folders whose modules wait longest on real clusters first.
# Within a folder the collection order stays (pytest's sort is stable).
_LONGEST_FIRST = ("tests/chaos/", "tests/e2e/", "tests/integration/", "tests/replay/", "tests/sim/")


def _start_rank(item: pytest.Item) -> int:
    tiers = (i for i, folder in enumerate(_LONGEST_FIRST) if item.nodeid.startswith(folder))
    return next(tiers, len(_LONGEST_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)


# RALLY_TEST_CPU=FOLDER: each worker appends, per test module, the CPU seconds it and every process it
# started and reaped (clusters, servers, ranks) spent from the module's first setup to its last teardown,
# to FOLDER/<pid>.tsv. The suite is CPU-bound on 2 cores; this says where the CPU goes.
_CPU_REPORT = os.environ.get("RALLY_TEST_CPU")
_module_cpu: dict[str, float] = {}


def _cpu_now() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _CPU_REPORT:
        _module_cpu.setdefault(item.nodeid.split("::")[0], _cpu_now())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    module = item.nodeid.split("::")[0]
    if _CPU_REPORT and (nextitem is None or nextitem.nodeid.split("::")[0] != module):
        spent = _cpu_now() - _module_cpu.pop(module, _cpu_now())
        with open(os.path.join(_CPU_REPORT, f"{os.getpid()}.tsv"), "a") as out:
            out.write(f"{spent:.2f}\t{module}\n")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    # Sync fixture on the main thread: the server's parent-death signal is tied to the spawning thread.
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    # No data dir from tmp_path_factory: pytest's /tmp/pytest-of-root is 0700, and when we are root
    # postgres runs as another OS user that could not enter it.
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def event_log(nats_server: NatsServer, request: pytest.FixtureRequest) -> AsyncIterator[EventLog]:
    nc = await connect_nats(nats_server.url, name=f"test-{request.node.name}"[:100])
    log = await _fresh_log(nc, nats_server)
    try:
        yield log
    finally:
        # Deleting the stream (not its messages) is allowed even with deny_delete/deny_purge.
        await log.js.delete_stream(log.stream)
        await log.close()


async def _fresh_log(nc: Client, server: NatsServer) -> EventLog:
    """An EventLog on a newly created, empty RALLY stream.

    nats-server removes a deleted stream's files asynchronously: a stream re-created under the same
    name at once can fail (10049) or, worse, pick up the old messages from the half-deleted directory
    (seen on 2.15.1 as a stray message in a "fresh" stream). So wait for the directory to go, and check
    the new stream really is empty.
    """
    js = nc.jetstream()
    deadline = time.monotonic() + 20.0
    why = ""
    lingering_since = time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream("RALLY")
        leftovers = list(server.store_dir.glob("jetstream/*/streams/RALLY"))
        if leftovers:
            why = "old stream directory still there"
            if time.monotonic() > lingering_since + 1.0:
                # Seen on 2.15.1: the stream is gone from the server but its directory stays for good.
                # The server no longer owns it, so remove it before a new stream adopts its messages.
                for path in leftovers:
                    shutil.rmtree(path, ignore_errors=True)
            await asyncio.sleep(0.02)
            continue
        try:
            log = await EventLog.attach(nc)
        except nats.js.errors.ServerError as exc:
            if exc.err_code != 10049:
                raise
            why = f"create refused: {exc.description}"
            await asyncio.sleep(0.02)
            continue
        last = (await js.stream_info("RALLY")).state.last_seq
        if last == 0:
            log._owns_connection = True
            return log
        why = f"new stream came up with old messages (last seq {last})"
    raise RuntimeError(f"could not create an empty RALLY stream: {why}")
