"""Leader lease handover and the service shell, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time

import nats
import pytest

from rallypoint.eventlog import EventLog
from rallypoint.infra import NatsServer
from rallypoint.runtime import LeaderLease, ServiceConfig, ServiceContext, run_service_async

TTL = 1.0


@pytest.fixture
async def js(nats_server: NatsServer) -> object:
    nc = await nats.connect(nats_server.url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


def bucket_name(request: pytest.FixtureRequest) -> str:
    return f"leader-{request.node.name.replace('_', '-')}"[:60]


async def test_one_contender_wins_and_the_other_takes_over_after_ttl(
    js: nats.js.JetStreamContext, request: pytest.FixtureRequest
) -> None:
    bucket = bucket_name(request)
    a = await LeaderLease.open(js, holder="a", bucket=bucket, ttl=TTL)
    b = await LeaderLease.open(js, holder="b", bucket=bucket, ttl=TTL)
    try:
        assert await a.campaign() is not None
        assert a.is_leader
        assert not await b.try_acquire()

        # A keeps renewing: B stays out for several TTLs.
        stop_b = asyncio.Event()
        b_campaign = asyncio.create_task(b.campaign(stop_b, poll=0.1))
        await asyncio.sleep(2.5 * TTL)
        assert not b_campaign.done() and a.is_leader and not a.lost.is_set()

        # A "crashes": no more renewals, no resign. B takes over within about one TTL.
        a.abandon()
        crashed_at = time.monotonic()
        epoch_b = await asyncio.wait_for(b_campaign, 4 * TTL)
        took = time.monotonic() - crashed_at
        assert b.is_leader and epoch_b is not None and a.epoch is not None
        assert epoch_b > a.epoch
        assert took < 2.5 * TTL, took

        # A's late renewal fails and it knows it lost.
        a._revision = a.epoch  # pretend A still thinks it holds its old term
        a.lost.clear()
        assert not await a.renew()
        assert a.lost.is_set()
    finally:
        await a.resign()
        await b.resign()
        await js.delete_key_value(bucket)


async def test_resign_hands_over_at_once(
    js: nats.js.JetStreamContext, request: pytest.FixtureRequest
) -> None:
    bucket = bucket_name(request)
    a = await LeaderLease.open(js, holder="a", bucket=bucket, ttl=5.0)
    b = await LeaderLease.open(js, holder="b", bucket=bucket, ttl=5.0)
    try:
        assert await a.try_acquire()
        assert not await b.try_acquire()
        await a.resign()
        assert a.lost.is_set() and not a.is_leader
        started = time.monotonic()
        assert await asyncio.wait_for(b.campaign(poll=0.05), 2.0) is not None
        assert time.monotonic() - started < 1.0  # not the 5 s TTL
    finally:
        await a.resign()
        await b.resign()
        await js.delete_key_value(bucket)


async def test_service_shell_runs_main_and_stops_on_request(nats_server: NatsServer) -> None:
    stop = asyncio.Event()
    seen: list[str] = []

    async def main(ctx: ServiceContext) -> int:
        nc = await ctx.nats(initial_timeout=5)
        seen.append(nc.connected_url.netloc if nc.connected_url else "")
        lease = await ctx.leader_lease(key="shell-test", ttl=2.0, bucket="leader-shell-test")
        assert await lease.campaign(ctx.stop) is not None
        await ctx.stop.wait()
        return 7

    config = ServiceConfig(service="shell-test", nats_url=nats_server.url, instance="i1")
    runner = asyncio.create_task(run_service_async(main, config, stop=stop))
    await asyncio.sleep(0.5)
    stop.set()
    assert await asyncio.wait_for(runner, 5) == 7
    assert seen == [nats_server.url.removeprefix("nats://")]
    nc = await nats.connect(nats_server.url)
    await nc.jetstream().delete_key_value("leader-shell-test")
    await nc.close()


def test_service_process_exits_cleanly_on_sigterm(nats_server: NatsServer) -> None:
    script = textwrap.dedent(
        """
        import sys
        from rallypoint.runtime import ServiceConfig, run_service

        async def main(ctx):
            await ctx.nats(initial_timeout=5)
            print("ready", flush=True)
            await ctx.stop.wait()
            return 0

        sys.exit(run_service(main, ServiceConfig(service="sigterm-test", nats_url=sys.argv[1],
                                                  instance="x")))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, nats_server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records and all(r["service"] == "sigterm-test" and r["instance"] == "x" for r in records)
    assert any("SIGTERM" in r["msg"] for r in records)


async def test_a_service_with_a_health_port_answers_healthz(
    nats_server: NatsServer, event_log: EventLog
) -> None:
    # event_log: the stream exists, as the admin's setup makes it (services never create it)
    import aiohttp

    from rallypoint.infra import free_port
    from rallypoint.runtime import ServiceConfig, run_service_async

    port = free_port()
    stop = asyncio.Event()
    reached = asyncio.Event()

    async def main(ctx: ServiceContext) -> int:
        await ctx.event_log()
        reached.set()
        await ctx.stop.wait()
        return 0

    config = ServiceConfig(service="probe", nats_url=nats_server.url, instance="p1", health_port=port)
    running = asyncio.create_task(run_service_async(main, config, stop=stop))
    await asyncio.wait_for(reached.wait(), 10)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/healthz") as response,
    ):
        body = await response.json()
    assert response.status == 200 and body["status"] == "ok" and body["service"] == "probe"
    stop.set()
    assert await asyncio.wait_for(running, 15) == 0


async def test_resign_ends_a_renewer_that_swallowed_its_cancellation(
    js: nats.js.JetStreamContext, request: pytest.FixtureRequest
) -> None:
    """Python 3.11's asyncio.wait_for (under nats-py's request) can swallow a cancellation that lands as
    its answer arrives; a renewer that did so went on renewing, and resign() awaited it forever."""
    bucket = bucket_name(request)
    a = await LeaderLease.open(js, holder="a", bucket=bucket, ttl=TTL)
    b = await LeaderLease.open(js, holder="b", bucket=bucket, ttl=TTL)
    renewing = asyncio.Event()
    real_renew = a.renew

    async def renew_swallowing_cancellation() -> bool:
        renewing.set()
        try:
            await asyncio.sleep(10 * TTL)  # a renewal under way when resign() cancels the renewer
        except asyncio.CancelledError:
            return await real_renew()  # swallowed: as if the answer had arrived with the cancellation
        return await real_renew()

    try:
        assert await a.try_acquire()
        a.renew = renew_swallowing_cancellation  # type: ignore[method-assign]
        await asyncio.wait_for(renewing.wait(), 5 * TTL)
        renewer = a._renewer
        started = time.monotonic()
        await asyncio.wait_for(a.resign(), 5 * TTL)
        assert time.monotonic() - started < 2 * TTL  # it waits one TTL at most, not until cancelled
        assert renewer is not None
        await asyncio.wait_for(asyncio.wait({renewer}), 3 * TTL)  # and the renewer stopped renewing
        assert await asyncio.wait_for(b.campaign(poll=0.05), 4 * TTL) is not None
    finally:
        await a.resign()
        await b.resign()
        await js.delete_key_value(bucket)
