"""What a service says about itself (issue 31, the metrics row): which replica of a leader-elected role
leads, in ``/healthz`` (``leader``) and ``/metrics`` (``rally_leader``), and no ``_created`` samples
doubling the counters of any service, the API's included."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from functools import partial

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rallypoint_services.api import http_metrics

from rallypoint.observability.instruments import SCHEDULER_CYCLES
from rallypoint.runtime import ServiceConfig
from rallypoint.runtime.health import health_report
from rallypoint.runtime.metrics import render
from rallypoint.runtime.reports import set_leadership
from rallypoint.runtime.service import ServiceContext


def context(service: str, instance: str) -> ServiceContext:
    config = ServiceConfig(service=service, nats_url="nats://x", instance=instance)
    return ServiceContext(config, asyncio.Event(), AsyncExitStack())


def leader_samples(ctx: ServiceContext) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["role"], sample.labels["instance"]): sample.value
        for family in text_string_to_metric_families(render(ctx).decode())
        if family.name == "rally_leader"
        for sample in family.samples
    }


async def test_healthz_and_metrics_say_which_replica_leads() -> None:
    leads = {"scheduler-1": False, "scheduler-2": True}
    replicas = {name: context("scheduler", name) for name in leads}
    for name, ctx in replicas.items():
        set_leadership(ctx, "scheduler", partial(leads.__getitem__, name))
    running = asyncio.ensure_future(asyncio.sleep(60))
    try:
        for name, ctx in replicas.items():
            assert health_report(ctx, running)["leader"] is leads[name]
            assert leader_samples(ctx) == {("scheduler", name): float(leads[name])}
        # the lease changes hands: both answers follow at once, nothing cached
        leads.update({"scheduler-1": True, "scheduler-2": False})
        assert health_report(replicas["scheduler-1"], running)["leader"] is True
        assert leader_samples(replicas["scheduler-2"]) == {("scheduler", "scheduler-2"): 0.0}
        # a service that elects no leader says null, and exports no leader gauge
        plain = context("preemption", "preemption-1")
        assert health_report(plain, running)["leader"] is None
        assert leader_samples(plain) == {}
    finally:
        running.cancel()


def test_no_created_samples_beside_the_counters() -> None:
    SCHEDULER_CYCLES.labels(result="idle").inc()
    http_metrics.API_REQUESTS.labels(route="/v1/jobs", method="GET", status="200").inc()
    service_text = render(context("scheduler", "s1")).decode()
    api_text = generate_latest(REGISTRY).decode()  # what the API appends to its own families
    for text in (service_text, api_text):
        assert "rally_scheduler_cycles_total" in text and "rally_api_requests_total" in text
        assert "_created" not in text, [line for line in text.splitlines() if "_created" in line][:3]


def test_counters_of_a_closed_label_set_start_every_series_at_zero() -> None:
    samples = {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(render(context("scheduler", "s1")).decode())
        for sample in family.samples
    }
    for name, label, values in (
        ("rally_scheduler_cycles_total", "result", ("appended", "idle", "error")),
        ("rally_gang_recoveries_total", "outcome", ("repaired", "shrunk", "requeued")),
        ("rally_heartbeats_received_total", "result", ("ok", "undecodable")),
        ("rally_agent_rank_launches_total", "result", ("started", "already_running")),
    ):
        for value in values:
            assert (name, ((label, value),)) in samples, (name, value)
