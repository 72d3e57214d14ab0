"""Metrics and traces: what every service shows operators (docs/observability.md).

``instruments``: the process's own counters and histograms (cycle durations, admissions, heartbeats).
``cluster``: gauges and log-derived totals computed from the folded state when Prometheus scrapes.
``tracing``: OpenTelemetry spans, their context carried across the log in NATS headers.
"""

from .cluster import ClusterCollector, cluster_families, fragmented_gpus
from .instruments import observe_writes

__all__ = ["ClusterCollector", "cluster_families", "fragmented_gpus", "observe_writes"]
