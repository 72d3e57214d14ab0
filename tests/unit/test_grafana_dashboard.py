"""deploy/grafana's dashboard queries only metrics our services export.

The exposition is built the way a scrape builds it: the process instruments (default registry), the
scheduler's cluster collector over a small folded log, and a service's own registry (log lag); every
``rally_*`` name a query uses must be one of its sample names.
"""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import AsyncExitStack
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rallypoint_services.api import http_metrics  # noqa: F401  (registers the API's instruments, as the API does)

from rallypoint.events import GpuInfo, NodeRegistered
from rallypoint.observability import ClusterCollector
from rallypoint.runtime import ServiceConfig
from rallypoint.runtime.metrics import render
from rallypoint.runtime.reports import set_fold_position, set_leadership
from rallypoint.runtime.service import ServiceContext
from rallypoint.state import ClusterState

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "grafana").glob("*.json"))
METRIC = re.compile(r"\brally_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exported_names() -> set[str]:
    state = ClusterState()
    gpus = (GpuInfo(index=0, uuid="g0", memory_mib=1, nvlink_domain=0),)
    registered = NodeRegistered(
        node_id="n1",
        address="a",
        rack="r1",
        gpu_type="H100",
        gpus=gpus,
        cpu_milli=1,
        memory_mib=1,
        agent_instance="a1",
        at=1.0,
    )
    state.apply(1, registered)
    cluster = CollectorRegistry()
    cluster.register(ClusterCollector(lambda: state))
    ctx = ServiceContext(
        ServiceConfig(service="scheduler", nats_url="nats://x"), asyncio.Event(), AsyncExitStack()
    )
    set_fold_position(ctx, lambda: (1, 2))
    set_leadership(ctx, "scheduler", lambda: True)
    text = (render(ctx) + generate_latest(cluster)).decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        # A labelled family nobody has used yet has no samples: its names follow from its type.
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def queries(path: Path) -> list[tuple[str, str]]:
    dashboard = json.loads(path.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_there_is_a_dashboard_with_queries() -> None:
    assert DASHBOARDS
    for path in DASHBOARDS:
        assert len(queries(path)) >= 10, path.name


def test_every_query_names_metrics_that_exist() -> None:
    exported = exported_names()
    for path in DASHBOARDS:
        for title, expr in queries(path):
            names = set(METRIC.findall(expr))
            assert names, f"{path.name} / {title}: no rally_ metric in {expr!r}"
            assert names <= exported, f"{path.name} / {title}: unknown {sorted(names - exported)}"
