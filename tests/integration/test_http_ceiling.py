"""The benches' HTTP ceiling (``bench.httpceiling``) does what it stands for: each request it answers
202 is one acked publish of the request's body into the scratch stream, under the request's key, so its
rate is HTTP plus a raw publish and nothing less. And the whole measurement (its own process, the lean
client) counts every request it sent."""

from __future__ import annotations

import contextlib

import nats.js.errors
from aiohttp import test_utils
from nats.js.api import StorageType, StreamConfig

from rallypoint.bench.httpceiling import SUBJECT_PREFIX, ceiling_app, http_ceiling
from rallypoint.bench.loadgen import SCRATCH_STREAM, create_scratch, spec_body
from rallypoint.eventlog import connect_nats
from rallypoint.infra import NatsServer


async def test_each_accepted_request_is_its_body_published_once_under_its_key(
    nats_server: NatsServer,
) -> None:
    nc = await connect_nats(nats_server.url, name="test-http-ceiling")
    js = nc.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(SCRATCH_STREAM)
    await js.add_stream(
        StreamConfig(name=SCRATCH_STREAM, subjects=["rallybench.>"], storage=StorageType.FILE)
    )
    try:
        async with test_utils.TestClient(test_utils.TestServer(ceiling_app(nc))) as client:
            answers = []
            for key in ("k-1", "k-2", "k-1"):
                response = await client.post(
                    "/v1/jobs", data=f'{{"key": "{key}"}}', headers={"Idempotency-Key": key}
                )
                answers.append((response.status, (await response.json())["job_id"]))
        assert [status for status, _ in answers] == [202, 202, 202]
        assert len({job_id for _, job_id in answers}) == 3
        # the repeated key is JetStream's duplicate: stored once, as the raw reference's repeats would be
        info = await js.stream_info(SCRATCH_STREAM)
        assert info.state.messages == 2
        first = await js.get_msg(SCRATCH_STREAM, seq=1)
        assert first.subject == SUBJECT_PREFIX + answers[0][1]
        assert first.data == b'{"key": "k-1"}'
        assert first.headers is not None and first.headers["Nats-Msg-Id"] == "k-1"
    finally:
        await js.delete_stream(SCRATCH_STREAM)
        await nc.close()


async def test_the_measurement_runs_its_own_process_and_leaves_no_stream(nats_server: NatsServer) -> None:
    nc = await connect_nats(nats_server.url, name="test-http-ceiling-rate")
    try:
        body = spec_body("ceiling", 1, 1)
        rate = await http_ceiling(nc, nats_server.url, 50, concurrency=4, body=body, token="t")
        assert rate > 0
        names = [info.config.name for info in await nc.jetstream().streams_info()]
        assert SCRATCH_STREAM not in names
    finally:
        await nc.close()


async def test_the_scratch_stream_takes_publishes_once_created(nats_server: NatsServer) -> None:
    """``create_scratch`` returns once the new stream has stored a probe, so the measured publishes never
    meet a stream that does not listen yet (a "no responders" answer)."""
    nc = await connect_nats(nats_server.url, name="test-scratch")
    js = nc.jetstream()
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(SCRATCH_STREAM)
        await create_scratch(js)
        assert (await js.stream_info(SCRATCH_STREAM)).state.messages == 1  # the probe
        ack = await js.publish("rallybench.job.x", b"{}", stream=SCRATCH_STREAM)
        assert ack.seq == 2
    finally:
        await js.delete_stream(SCRATCH_STREAM)
        await nc.close()
