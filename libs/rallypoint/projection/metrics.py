"""The projector's own Prometheus family, computed at each scrape from the projector it watches."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from .projector import Projector


class QuarantineCollector(Collector):
    """``rally_projector_quarantined_events_total{projection}``: the events PostgreSQL refused, which the
    projection quarantined instead of projecting (0 from the start, so an alert can rely on the series).

    The count is the projection's quarantine table as this projector knows it (read at each sync, then
    added to), so a restart does not reset it; a rebuild does, and counts again what it quarantines.
    """

    def __init__(self, projector: Projector) -> None:
        self._projector = projector

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "rally_projector_quarantined_events",
            "Events PostgreSQL refused to store (NUL in text, numbers out of range): quarantined, not "
            "projected; `rally projector status` lists them.",
            labels=["projection"],
        )
        family.add_metric([self._projector.name], self._projector.quarantined_total)
        return [family]
