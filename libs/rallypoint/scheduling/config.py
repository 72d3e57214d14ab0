"""The queue configuration file, read the same way by the scheduler service and the simulator."""

from __future__ import annotations

from pathlib import Path

from rallypoint.core.types import CPU, DEFAULT_PRIORITY_CLASSES, MEMORY, PriorityClass, Queue, Quota

from .queues import Org, Queues, Team, load_queues


def core_queues(config: Queues) -> tuple[tuple[Queue, ...], tuple[PriorityClass, ...]]:
    """The core's queues (teams, then orgs, each sorted by name) and priority classes."""
    teams = tuple(
        Queue(
            name=team.name,
            parent=team.parent,
            cohort=team.cohort,
            weight=team.weight,
            user_weights=tuple(sorted(team.users.items())),
            service_gpus=team.service_gpus,
            quotas=(
                Quota(
                    nominal=team.nominal,
                    borrowing_limit=team.borrowing_limit,
                    lending_limit=team.lending_limit,
                ),
                *_resource_quotas(team),
            ),
        )
        for team in sorted(config.teams, key=lambda t: t.name)
    )
    queues = teams + tuple(_org_queue(org) for org in sorted(config.orgs, key=lambda o: o.name))
    if config.priority_classes is None:
        return queues, DEFAULT_PRIORITY_CLASSES
    classes = tuple(
        PriorityClass(name=c.name, value=c.value, preemptible=c.preemptible) for c in config.priority_classes
    )
    return queues, classes


def _resource_quotas(team: Team) -> tuple[Quota, ...]:
    """The team's CPU (millicores) and memory (MiB) nominal, where the file sets them."""
    out = []
    if team.cpus is not None:
        out.append(Quota(gpu_type=CPU, nominal=round(team.cpus * 1000)))
    if team.memory_gib is not None:
        out.append(Quota(gpu_type=MEMORY, nominal=round(team.memory_gib * 1024)))
    return tuple(out)


def _org_queue(org: Org) -> Queue:
    """An org caps the sum below it at its limit (the core's parent cap is nominal + borrowing limit, no
    borrowing for an org); an org without a limit only groups. Its cohort is never used: the core keeps
    parents out of cohorts."""
    quotas = () if org.limit is None else (Quota(nominal=org.limit),)
    return Queue(name=org.name, parent=org.parent, quotas=quotas)


def load_queue_config(path: str | Path | None) -> tuple[tuple[Queue, ...], tuple[PriorityClass, ...]]:
    """No file: no quotas and the default priority classes."""
    if path is None:
        return (), DEFAULT_PRIORITY_CLASSES
    return core_queues(load_queues(path))
