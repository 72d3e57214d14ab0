"""The queue configuration (JSON or YAML): teams, cohorts, quotas, priority classes, weights.

::

    priority_classes:            # higher value = more important; omitted: the scheduler's defaults
      - {name: training-high, value: 800}
      - {name: training-standard, value: 500}
      - {name: best-effort, value: 0}
    default_priority: training-standard
    cohorts: [{name: all}]
    teams:
      - {name: nlp, cohort: all, nominal: 64, borrowing_limit: 128, weight: 2}

``nominal`` is the team's guaranteed GPUs; ``borrowing_limit`` caps how many GPUs above nominal it may borrow
from idle quota in its cohort (None: unlimited); ``lending_limit`` how many of its nominal GPUs others may
borrow; ``weight`` its fair-share weight. A job whose team is not listed lands in a team with nominal 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from rallypoint.configfile import read_structured


class QueuesError(ValueError):
    """A queue configuration is malformed."""


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True


class Cohort(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str


class Team(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    nominal: int = 0
    cohort: str = "default"
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    weight: float = 1.0


class Queues(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    teams: list[Team] = []
    cohorts: list[Cohort] = []
    # None: the scheduler's built-in classes (production, training-high, training-standard, development,
    # best-effort), so a config without classes means the same thing to the simulator and the service.
    priority_classes: list[PriorityClass] | None = None
    default_priority: str = "training-standard"

    def team(self, name: str) -> Team:
        for t in self.teams:
            if t.name == name:
                return t
        return Team(name=name)

    def nominal(self, name: str) -> int:
        return self.team(name).nominal

    def nominals(self) -> dict[str, int]:
        """Team name -> nominal GPUs, for every configured team."""
        return {t.name: t.nominal for t in self.teams}

    def class_of(self, name: str | None) -> str:
        return name or self.default_priority


def validate_queues(q: Queues) -> None:
    names = [t.name for t in q.teams]
    if len(set(names)) != len(names):
        raise QueuesError("duplicate team name")
    if any(t.nominal < 0 or t.weight <= 0 for t in q.teams):
        raise QueuesError("team nominal must be >= 0 and weight > 0")
    classes = [c.name for c in q.priority_classes or ()]
    if len(set(classes)) != len(classes):
        raise QueuesError("duplicate priority class")
    if classes and q.default_priority not in classes:
        raise QueuesError(f"default_priority {q.default_priority!r} is not a priority class")
    known = {c.name for c in q.cohorts} | {"default"}
    for t in q.teams:
        if q.cohorts and t.cohort not in known:
            raise QueuesError(f"team {t.name}: unknown cohort {t.cohort!r}")


def queues_from_obj(obj: Any, source: str = "<queues>") -> Queues:
    try:
        q = msgspec.convert(obj or {}, Queues)
        validate_queues(q)
    except (msgspec.ValidationError, QueuesError) as e:
        raise QueuesError(f"{source}: {e}") from None
    return q


def load_queues(path: str | Path) -> Queues:
    try:
        obj = read_structured(path, "queues")
    except ValueError as e:
        raise QueuesError(str(e)) from None
    return queues_from_obj(obj, str(path))


def queues_to_obj(q: Queues) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(q)
    return out
