"""GET /healthz for services without an HTTP API of their own, for Kubernetes and compose probes (the same
server answers GET /metrics: ``rallypoint.runtime.metrics``).

Three answers: ``ok`` (200); ``degraded`` (200: the service runs and follows the log but meets something it
cannot understand, such as a newer version of an event during a rolling upgrade; restarting it would not
help, upgrading it does); ``unhealthy`` (503: restart it). ``/readyz`` is 503 unless the status is ``ok``,
for deployments that want a degraded instance out of rotation.

Parts of a service add what they know with ``add_health_check`` (the log follower does).

Every answer also says whether this instance leads its role (``leader``: true or false for a
leader-elected service, null for the others) and where the service stands with the log (``log``): whether
it reaches it (NATS connected) and, for a service that folds it, the sequence its fold has applied, the
stream's last sequence (probed every few seconds) and the lag between them; for a fold of part of the log,
the last sequence stored on its subjects, which ``fold_subjects`` names (both kept in ``reports``, which
the metrics read too). A service that lost its NATS connection is ``degraded`` (not ready), not
``unhealthy``: the client reconnects by itself and a restart would not bring the server back (a restart
storm would only hit it harder when it returns); a closed connection is unhealthy.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .metrics import add_metrics_route
from .reports import leadership, log_report

if TYPE_CHECKING:
    from .service import ServiceContext

#: Returns the reasons for its concern now; an empty list when all is well.
HealthCheck = Callable[[], list[str]]

# ServiceContext -> (checks that make it unhealthy, checks that make it degraded). Weak: a context lives
# as long as its service and nothing here may keep it alive.
_checks: weakref.WeakKeyDictionary[ServiceContext, tuple[list[HealthCheck], list[HealthCheck]]] = (
    weakref.WeakKeyDictionary()
)


def add_health_check(ctx: ServiceContext, check: HealthCheck, *, degraded: bool) -> None:
    """Have ``/healthz`` ask ``check``: its reasons make the service degraded, or else unhealthy."""
    unhealthy, degrading = _checks.setdefault(ctx, ([], []))
    (degrading if degraded else unhealthy).append(check)


def health_report(ctx: ServiceContext, main_task: asyncio.Task[int | None]) -> dict[str, Any]:
    """The /healthz body: status, problems (unhealthy) and degraded reasons."""
    unhealthy, degrading = _checks.get(ctx, ([], []))
    problems = [reason for check in unhealthy for reason in check()]
    if main_task.done():
        problems.append("main task ended")
    degraded = [reason for check in degrading for reason in check()]
    leads = leadership(ctx)
    nc = ctx.nats_client
    if nc is not None and nc.is_closed:
        problems.append("NATS connection closed")
    elif nc is not None and not nc.is_connected:
        degraded.append("NATS not connected (reconnecting): the log is out of reach")
    return {
        "service": ctx.config.service,
        "instance": ctx.config.instance,
        "status": "unhealthy" if problems else "degraded" if degraded else "ok",
        "problems": problems,
        "degraded": degraded,
        "log": log_report(ctx),
        # Which replica of a leader-elected role leads (both answer ok); null for a service without one.
        "leader": None if leads is None else leads.leads,
    }


async def serve_health(ctx: ServiceContext, main_task: asyncio.Task[int | None], port: int) -> None:
    """Healthy while the service's main task runs and its NATS connection (if opened) is connected."""

    async def healthz(_request: web.Request) -> web.Response:
        body = health_report(ctx, main_task)
        return web.json_response(body, status=503 if body["status"] == "unhealthy" else 200)

    async def readyz(_request: web.Request) -> web.Response:
        body = health_report(ctx, main_task)
        return web.json_response(body, status=200 if body["status"] == "ok" else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    add_metrics_route(app, ctx)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port)
    await site.start()
    ctx.stack.push_async_callback(runner.cleanup)
