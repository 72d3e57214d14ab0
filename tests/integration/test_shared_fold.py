"""Services hosted in one process fold the log once (``runtime.cohost``, ``following.SharedFold``): one
follow, one consumer on the stream, one state; yet each service keeps its own wake-up, change feed and
health report, and a hosted service that ends takes its host down with an error code."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from rallypoint.eventlog import EventLog
from rallypoint.events import LeaderEpochStarted, subjects
from rallypoint.infra import NatsServer
from rallypoint.runtime import ServiceConfig, ServiceContext
from rallypoint.runtime.cohost import run_hosted_async
from rallypoint.runtime.following import open_follower, sharing_one_fold
from rallypoint.runtime.reports import log_report
from rallypoint.runtime.service import EXIT_ERROR, EXIT_OK

HOSTED = ("job-controller", "checkpoint", "preemption")
WAIT_S = 30.0


async def _register(log: EventLog, epoch: int) -> int:
    """Any event will do: a scheduler's epoch is the smallest."""
    event = LeaderEpochStarted(epoch=epoch, leader_id="s", at=float(epoch))
    return await log.append(subjects.for_event(event), event, msg_id=f"epoch-{epoch}", source="t")


def _context(server: NatsServer, service: str, stack: AsyncExitStack) -> ServiceContext:
    return ServiceContext(
        ServiceConfig(service=service, nats_url=server.url, instance=service), asyncio.Event(), stack
    )


async def test_hosted_services_share_one_fold_and_one_consumer(
    event_log: EventLog, nats_server: NatsServer
) -> None:
    first = await _register(event_log, 1)
    async with AsyncExitStack() as stack:
        contexts = [_context(nats_server, service, stack) for service in HOSTED]
        with sharing_one_fold(owner="job-controller"):
            # the others ask first: they wait for the owner's fold instead of opening their own
            followers = await asyncio.gather(
                *(open_follower(ctx, snapshots=False) for ctx in reversed(contexts))
            )
        assert all(follower is followers[0] for follower in followers)
        follower = followers[0]
        assert follower.state.last_seq == first

        mine, theirs = follower.change_signal(), follower.change_signal()
        second = await _register(event_log, 2)
        await follower.wait_for(second, timeout=WAIT_S)
        # One live follow from the fold's position, which delivered that event (a catch-up's replay
        # consumer may linger a moment beside it).
        consumers = await event_log.js.consumers_info(event_log.stream)
        follows = [info for info in consumers if info.config.opt_start_seq == first + 1]
        assert len(follows) == 1, [info.config for info in consumers]
        async with asyncio.timeout(WAIT_S):
            await mine.wait()
            await theirs.wait()
        mine.clear()  # one consumer's look at the changes leaves the other's wake-up set
        assert theirs.is_set() and not mine.is_set()
        for ctx in contexts:  # each service reports the fold in its own /healthz
            assert log_report(ctx)["fold_seq"] == second


async def test_a_hosted_service_that_ends_stops_the_others_and_fails_the_host() -> None:
    stopped: list[str] = []

    async def ends_at_once(ctx: ServiceContext) -> int:
        return EXIT_OK

    async def runs_until_stopped(ctx: ServiceContext) -> int:
        await ctx.stop.wait()
        stopped.append(ctx.config.service)
        return EXIT_OK

    services = [
        (runs_until_stopped, ServiceConfig(service="job-controller", instance="a")),
        (ends_at_once, ServiceConfig(service="checkpoint", instance="a")),
    ]
    async with asyncio.timeout(WAIT_S):
        code = await run_hosted_async(services, shutdown_grace=5.0)
    assert stopped == ["job-controller"]
    # It returned 0, but unasked: the host exits with an error so its supervisor restarts all of them.
    assert code == EXIT_ERROR
