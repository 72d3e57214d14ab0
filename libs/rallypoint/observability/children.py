"""A labelled metric's children, kept by label values.

``labels()`` checks its arguments and looks them up under a lock on every call: on a path taken once per
job (a submission's request, a gang's bind) that was a measurable part of its cost. The children are
bounded as the metric's series are (route patterns, teams, priority classes).
"""

from __future__ import annotations

from typing import Any


class LabelChildren:
    """``metric.labels(*values)``, looked up once per distinct ``values`` (positional, in label order)."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.by_labels: dict[tuple[str, ...], Any] = {}

    def get(self, *labels: str) -> Any:
        child = self.by_labels.get(labels)
        if child is None:
            child = self.by_labels[labels] = self.metric.labels(*labels)
        return child
