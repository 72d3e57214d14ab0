"""GET /metrics beside /healthz: Prometheus text for every service (docs/observability.md).

A scrape returns the process's own instruments (prometheus-client's default registry: our counters and
histograms, process and Python collectors) followed by the collectors a service registered for itself with
``add_collector`` (the scheduler's cluster gauges), the fold's place in the log (``rally_log_lag``),
which every service that folds the log reports through ``set_fold_position``, and for a leader-elected
service whether this instance leads (``rally_leader``, from ``set_leadership``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .reports import leadership, log_report

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .service import ServiceContext

CONTENT_TYPE = "text/plain"  # aiohttp adds the charset; the text format's version 0.0.4 is the default

# One registry per service context (weak: it lives as long as its service; tests run several in a process).
_registries: weakref.WeakKeyDictionary[ServiceContext, CollectorRegistry] = weakref.WeakKeyDictionary()


def _registry(ctx: ServiceContext) -> CollectorRegistry:
    registry = _registries.get(ctx)
    if registry is None:
        registry = _registries[ctx] = CollectorRegistry(auto_describe=False)
        registry.register(_LogLag(ctx))
        registry.register(_Leader(ctx))
    return registry


def add_collector(ctx: ServiceContext, collector: Collector) -> None:
    """Have this service's ``/metrics`` include ``collector`` (computed at each scrape)."""
    _registry(ctx).register(collector)


class _LogLag(Collector):
    """How far the service's fold is behind the stream (the Follower's ``position()``), by consumer."""

    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = weakref.ref(ctx)

    def collect(self) -> Iterable[Metric]:
        ctx = self._ctx()
        if ctx is None:
            return []
        report = log_report(ctx)
        consumer = [ctx.config.service, ctx.config.instance]
        connected = GaugeMetricFamily(
            "rally_log_connected", "1 while this service reaches NATS.", labels=["consumer", "instance"]
        )
        connected.add_metric(consumer, int(report["connected"]))
        families: list[Metric] = [connected]
        if report.get("lag") is not None:
            lag = GaugeMetricFamily(
                "rally_log_lag_events",
                "Events in the stream this service's fold has not applied yet (stream seq - fold seq).",
                labels=["consumer", "instance"],
            )
            lag.add_metric(consumer, report["lag"])
            stream = GaugeMetricFamily(
                "rally_log_stream_seq",
                "The stream's last sequence when last probed.",
                labels=["consumer", "instance"],
            )
            stream.add_metric(consumer, report["stream_seq"])
            families += [lag, stream]
        return families


class _Leader(Collector):
    """``rally_leader{role, instance}``: 1 on the replica that leads its role now, 0 on the others, so a
    query finds the leader and an alert sees a role with none (sum 0) or two (sum 2); nothing for a
    service that is not leader-elected."""

    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = weakref.ref(ctx)

    def collect(self) -> Iterable[Metric]:
        ctx = self._ctx()
        leads = None if ctx is None else leadership(ctx)
        if ctx is None or leads is None:
            return []
        family = GaugeMetricFamily(
            "rally_leader",
            "1 while this instance leads its leader-elected role (the scheduler, the projector), else 0.",
            labels=["role", "instance"],
        )
        family.add_metric([leads.role, ctx.config.instance], int(leads.leads))
        return [family]


def render(ctx: ServiceContext) -> bytes:
    """The exposition text of one service: process instruments, then its own collectors."""
    return generate_latest(REGISTRY) + generate_latest(_registry(ctx))


def add_metrics_route(app: web.Application, ctx: ServiceContext) -> None:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=render(ctx), content_type=CONTENT_TYPE)

    app.router.add_get("/metrics", metrics)
