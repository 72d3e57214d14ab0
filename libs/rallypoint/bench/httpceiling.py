"""The most any HTTP front can accept on this machine: a bare aiohttp process that does one thing per request.

``rally bench cluster`` and ``apibench`` compare accepted submissions with raw acked JetStream
publishes at the same concurrency (``loadgen.raw_publish``). A submission also crosses HTTP, which a
raw publish does not: the client writes a request, a server process parses it and answers. This
measures what that alone costs on the same cores, in the same run: a process serving ``POST /v1/jobs``
with aiohttp (the API's own server) that reads the body, makes one acked publish of it into the scratch
stream (the raw reference's stream, subject and message-id header) and answers 202 with a job id. It
checks no token, validates nothing, folds nothing and keeps nothing, so no API can accept more per
second than it does; ``submissions_over_http_ceiling`` says how far the real API is from that ceiling,
and ``http_ceiling_over_raw`` what HTTP alone leaves of the raw publish rate.

Run by the benches as ``python -m rallypoint.bench.httpceiling --port P``, the NATS URL (with
its credentials) in ``RALLY_CEILING_NATS_URL`` so no password shows in the process list.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from nats.aio.client import Client

from rallypoint.infra import ManagedProcess, free_port

from .leanhttp import submit_lean
from .loadgen import SCRATCH_STREAM, create_scratch

NATS_URL_ENV = "RALLY_CEILING_NATS_URL"
SUBJECT_PREFIX = "rallybench.front."


def ceiling_app(nc: Client) -> web.Application:
    """``POST /v1/jobs``: the body published once into the scratch stream, then 202. ``GET /healthz``."""
    js = nc.jetstream()
    numbers = itertools.count()

    async def submit(request: web.Request) -> web.Response:
        body = await request.read()
        job_id = f"front-{next(numbers)}"
        headers = {"Nats-Msg-Id": request.headers.get("Idempotency-Key", job_id)}
        await js.publish(SUBJECT_PREFIX + job_id, body, headers=headers, stream=SCRATCH_STREAM)
        return web.json_response({"job_id": job_id}, status=202)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/healthz", healthz)
    return app


async def _serve(nats_url: str, port: int) -> None:
    nc = Client()
    servers = nats_url.split(",")  # a JetStream cluster's members, comma-separated
    await nc.connect(servers, name="http-ceiling", max_reconnect_attempts=0)
    runner = web.AppRunner(ceiling_app(nc), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()  # until the bench stops this process
    finally:
        await runner.cleanup()
        await nc.close()


async def _wait_ready(url: str, process: ManagedProcess, timeout: float) -> None:
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.running():
            raise RuntimeError(f"the HTTP ceiling process exited: {process.log_tail()}")
        try:
            _, writer = await asyncio.open_connection(host, int(port))
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError(f"the HTTP ceiling process did not listen within {timeout:.0f} s")


async def http_ceiling(
    nc: Client, nats_url: str, count: int, *, concurrency: int, body: dict[str, Any], token: str | None
) -> float:
    """Requests per second the bare front accepted (answered 202 once published), ``concurrency`` in
    flight from the benches' lean client with the submissions' own ``body`` and bearer ``token`` (sent,
    not checked), so the requests are the same bytes; the scratch stream exists only meanwhile."""
    js = nc.jetstream()
    await create_scratch(js)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="rally-ceiling-") as folder:
        argv = [sys.executable, "-m", "rallypoint.bench.httpceiling", "--port", str(port)]
        env = {**os.environ, NATS_URL_ENV: nats_url}
        process = ManagedProcess(argv, log_path=Path(folder) / "ceiling.log", env=env)
        try:
            await _wait_ready(url, process, timeout=60)
            ok, took, failed = await submit_lean(
                url, count, concurrency=concurrency, body=body, prefix="ceiling", time_limit_s=60,
                token=token,
            )  # fmt: skip
        finally:
            process.stop()
            await js.delete_stream(SCRATCH_STREAM)
    if failed or not ok:
        raise RuntimeError(f"the HTTP ceiling refused {failed} of {count} requests")
    return len(ok) / took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.httpceiling", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="the port to serve on, on 127.0.0.1")
    args = parser.parse_args(argv)
    nats_url = os.environ.get(NATS_URL_ENV)
    if not nats_url:
        print(f"httpceiling: set {NATS_URL_ENV} to the NATS server's URL", file=sys.stderr)
        return 2
    asyncio.run(_serve(nats_url, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
