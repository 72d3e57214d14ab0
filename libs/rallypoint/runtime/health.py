"""GET /healthz for services without an HTTP API of their own, for Kubernetes and compose probes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from .service import ServiceContext


async def serve_health(ctx: ServiceContext, main_task: asyncio.Task[int | None], port: int) -> None:
    """Healthy while the service's main task runs and its NATS connection (if opened) is connected."""

    async def healthz(_request: web.Request) -> web.Response:
        nc = ctx.nats_client
        problems = []
        if main_task.done():
            problems.append("main task ended")
        if nc is not None and not nc.is_connected:
            problems.append("NATS not connected")
        body = {
            "service": ctx.config.service,
            "instance": ctx.config.instance,
            "status": "unhealthy" if problems else "ok",
            "problems": problems,
        }
        return web.json_response(body, status=503 if problems else 200)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port)
    await site.start()
    ctx.stack.push_async_callback(runner.cleanup)
