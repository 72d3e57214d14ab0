"""The queue configuration file, read the same way by the scheduler service and the simulator."""

from __future__ import annotations

from pathlib import Path

from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES, PriorityClass, Queue, Quota

from .queues import Queues, load_queues


def core_queues(config: Queues) -> tuple[tuple[Queue, ...], tuple[PriorityClass, ...]]:
    queues = tuple(
        Queue(
            name=team.name,
            cohort=team.cohort,
            weight=team.weight,
            quotas=(
                Quota(
                    nominal=team.nominal,
                    borrowing_limit=team.borrowing_limit,
                    lending_limit=team.lending_limit,
                ),
            ),
        )
        for team in sorted(config.teams, key=lambda t: t.name)
    )
    if config.priority_classes is None:
        return queues, DEFAULT_PRIORITY_CLASSES
    classes = tuple(
        PriorityClass(name=c.name, value=c.value, preemptible=c.preemptible) for c in config.priority_classes
    )
    return queues, classes


def load_queue_config(path: str | Path | None) -> tuple[tuple[Queue, ...], tuple[PriorityClass, ...]]:
    """No file: no quotas and the default priority classes."""
    if path is None:
        return (), DEFAULT_PRIORITY_CLASSES
    return core_queues(load_queues(path))
