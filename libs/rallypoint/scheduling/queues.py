"""The queue configuration (JSON or YAML): teams, cohorts, quotas, priority classes, weights.

::

    priority_classes:            # higher value = more important; omitted: the scheduler's defaults
      - {name: training-high, value: 800}
      - {name: training-standard, value: 500}
      - {name: best-effort, value: 0}
    default_priority: training-standard
    cohorts: [{name: all}]
    orgs:                        # optional hierarchy: org > org > ... > team
      - {name: research, limit: 192}
      - {name: language, parent: research, limit: 128}
    teams:
      - {name: nlp, parent: language, cohort: all, nominal: 64, borrowing_limit: 128, weight: 2,
         max_priority: training-high}

``nominal`` is the team's guaranteed GPUs; ``borrowing_limit`` caps how many GPUs above nominal it may borrow
from idle quota in its cohort (None: unlimited); ``lending_limit`` how many of its nominal GPUs others may
borrow; ``weight`` its fair-share weight; ``max_priority`` the most important class its jobs may ask for
(None: every class), which the API enforces at submission as Slurm's per-account QOS list does. A job
whose team is not listed lands in a team with nominal 0 and no priority ceiling.

An org's ``limit`` caps the GPUs held by everything below it (its teams, and its sub-orgs' teams) however
much idle quota their cohorts could lend; an org without ``limit`` only groups. A team's ``parent`` names an
org, an org's ``parent`` another org. Jobs name teams, never orgs; names are unique across both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from rallypoint.configfile import read_structured
from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES


class QueuesError(ValueError):
    """A queue configuration is malformed."""


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True


class Cohort(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str


class Org(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    parent: str | None = None
    limit: int | None = None


class Team(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    parent: str | None = None
    nominal: int = 0
    cohort: str = "default"
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    weight: float = 1.0
    max_priority: str | None = None


class Queues(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    teams: list[Team] = []
    cohorts: list[Cohort] = []
    orgs: list[Org] = []
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

    def org(self, name: str) -> Org | None:
        for o in self.orgs:
            if o.name == name:
                return o
        return None

    def lineage(self, team: str) -> list[str]:
        """The orgs above ``team``, nearest first (empty for a team without a parent)."""
        out: list[str] = []
        parent = self.team(team).parent
        while parent is not None and parent not in out:
            out.append(parent)
            org = self.org(parent)
            parent = org.parent if org is not None else None
        return out

    def class_of(self, name: str | None) -> str:
        return name or self.default_priority

    def class_values(self) -> dict[str, int]:
        classes = self.priority_classes if self.priority_classes is not None else DEFAULT_PRIORITY_CLASSES
        return {c.name: c.value for c in classes}

    def priority_refusal(self, team: str, priority: str) -> str | None:
        """Why ``team`` may not submit at ``priority`` (None: it may): above its ``max_priority``."""
        ceiling = self.team(team).max_priority
        if ceiling is None:
            return None
        values = self.class_values()
        if values.get(priority, 0) <= values[ceiling]:
            return None
        allowed = sorted((n for n, v in values.items() if v <= values[ceiling]), key=lambda n: -values[n])
        return (
            f"team {team!r} may submit at priority {ceiling!r} or below ({', '.join(allowed)}); "
            f"{priority!r} is above it"
        )


def validate_queues(q: Queues) -> None:
    names = [t.name for t in q.teams]
    if len(set(names)) != len(names):
        raise QueuesError("duplicate team name")
    if any(t.nominal < 0 or t.weight <= 0 for t in q.teams):
        raise QueuesError("team nominal must be >= 0 and weight > 0")
    classes = [c.name for c in q.priority_classes or ()]
    if len(set(classes)) != len(classes):
        raise QueuesError("duplicate priority class")
    # Checked against the built-in classes too when the file lists none: a default the scheduler does not
    # know would value every job submitted without a class at 0. (``priority_classes: []``, no class at
    # all, stays accepted: every class counts 0 there, docs/simulator.md.)
    if (q.priority_classes is None or classes) and q.default_priority not in q.class_values():
        raise QueuesError(f"default_priority {q.default_priority!r} is not a priority class")
    known = {c.name for c in q.cohorts} | {"default"}
    class_names = q.class_values()
    for t in q.teams:
        if q.cohorts and t.cohort not in known:
            raise QueuesError(f"team {t.name}: unknown cohort {t.cohort!r}")
        if t.max_priority is not None and t.max_priority not in class_names:
            raise QueuesError(f"team {t.name}: max_priority {t.max_priority!r} is not a priority class")
    _validate_orgs(q)


def _validate_orgs(q: Queues) -> None:
    """Org names unique and distinct from team names, every parent an org, no org its own ancestor."""
    orgs = {o.name: o for o in q.orgs}
    if len(orgs) != len(q.orgs):
        raise QueuesError("duplicate org name")
    clash = sorted(orgs.keys() & {t.name for t in q.teams})
    if clash:
        raise QueuesError(f"{clash[0]!r} is both an org and a team")
    for kind, name, parent in [
        *(("team", t.name, t.parent) for t in q.teams),
        *(("org", o.name, o.parent) for o in q.orgs),
    ]:
        if parent is not None and parent not in orgs:
            raise QueuesError(f"{kind} {name}: parent {parent!r} is not an org")
    for o in q.orgs:
        if o.limit is not None and o.limit < 0:
            raise QueuesError(f"org {o.name}: limit must be >= 0")
        seen = {o.name}
        parent = o.parent
        while parent is not None:
            if parent in seen:
                raise QueuesError(f"org {o.name}: its parents form a cycle through {parent!r}")
            seen.add(parent)
            parent = orgs[parent].parent


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
