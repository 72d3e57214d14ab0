"""`rally port-forward` exits at Ctrl-C, with exit code 0, even when it was started the way a script starts a
background job (SIGINT inherited as ignored, which Python keeps: it then ignored Ctrl-C for good, and the live
port test hung whenever the suite itself ran in the background) and while a tunnel is open whose close the
API never answers. A real aiohttp server stands in for the API (the job, and its port endpoint, which never
reads what the client sends); the real CLI runs in its own process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

from aiohttp import web


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _api_that_never_closes(opened: asyncio.Event) -> web.AppRunner:
    async def job(_request: web.Request) -> web.Response:
        return web.json_response({"job_id": "j-1", "state": "running", "spec": {"ports": [8888]}})

    async def port_endpoint(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoclose=False)
        await ws.prepare(request)
        opened.set()
        await asyncio.sleep(3600)  # never reads: the client's close frame is never answered
        return ws

    app = web.Application()
    app.router.add_get("/v1/jobs/{job_id}", job)
    app.router.add_get("/v1/jobs/{job_id}/ports/{port}", port_endpoint)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    return runner


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the forwarder, once it listens (it says it reaches the port just before)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            await asyncio.sleep(0.05)


async def test_ctrl_c_ends_rally_port_forward_started_in_the_background_with_a_tunnel_open() -> None:
    opened = asyncio.Event()
    runner = await _api_that_never_closes(opened)
    api_port, local_port = _free_port(), _free_port()
    await web.TCPSite(runner, "127.0.0.1", api_port).start()
    env = {**os.environ, "RALLY_API_URL": f"http://127.0.0.1:{api_port}"}
    env.pop("RALLY_TOKEN", None)
    # as a script's background job starts: SIGINT ignored (``trap "" INT``; ``exec`` keeps it so)
    cli = await asyncio.create_subprocess_exec(
        "bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-m", "rallypoint.cli.main",
        "port-forward", "j-1", "8888", "--local-port", str(local_port),
        env=env, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert cli.stderr is not None
        assert b"reaches port" in await asyncio.wait_for(cli.stderr.readline(), 30)
        _reader, writer = await _connect(local_port)  # kept open
        await asyncio.wait_for(opened.wait(), 30)
        cli.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = await asyncio.wait_for(cli.wait(), 30)
        assert time.monotonic() - sent < 5.0, f"exited {time.monotonic() - sent:.1f} s after Ctrl-C"
        assert code == 0
        writer.close()
    finally:
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
        await runner.cleanup()
