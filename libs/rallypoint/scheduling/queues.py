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

Fair use (enforced by the API at submission; docs/api.md): a team's ``max_pending_jobs`` caps its jobs
waiting for the scheduler, ``submissions_per_minute`` (with ``submission_burst``, a token bucket) its
submission rate, and ``priorities`` lists the classes it may ask for. An org may set them too: a team
without its own value takes its nearest org's. Unset everywhere: no cap, no rate limit, and every class
but ``production`` (``RESERVED_PRIORITIES``: granted only by naming it in ``priorities``, or by a
``max_priority`` at or above it).

``nominal`` is the team's guaranteed GPUs; ``borrowing_limit`` caps how many GPUs above nominal it may borrow
from idle quota in its cohort (None: unlimited); ``lending_limit`` how many of its nominal GPUs others may
borrow; ``weight`` its fair-share weight; ``max_priority`` the most important class its jobs may ask for
(None: every class), which the API enforces at submission as Slurm's per-account QOS list does. A job
whose team is not listed lands in a team with nominal 0 and no priority ceiling. ``cpus`` and ``memory_gib``
are the team's guaranteed CPU cores and host memory, borrowed and lent within its cohort as GPUs are; once
any team sets one, a team without it runs CPU or memory requests on borrowed quota only (docs/sharing.md).
``users`` weighs the fair share between the team's users (``users: {alice: 2}``: alice's usage counts half;
unlisted users weigh 1; docs/scheduling-core.md "Fair share between a team's users").
``service_gpus`` reserves part of a team's nominal for its services (``kind: service``, docs/api.md
"Services"): they hold at most that many GPUs together, a service beyond waits, and they are never
preempted; a team without it does not cap its services.

An org's ``limit`` caps the GPUs held by everything below it (its teams, and its sub-orgs' teams) however
much idle quota their cohorts could lend; an org without ``limit`` only groups. A team's ``parent`` names an
org, an org's ``parent`` another org. Jobs name teams, never orgs; names are unique across both.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec

from rallypoint.configfile import read_structured
from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES

#: Classes no team may use unless the queue file grants them (``priorities``, or ``max_priority``): one
#: team submitting everything as production would preempt every other team's work.
RESERVED_PRIORITIES: frozenset[str] = frozenset({"production"})


class QueuesError(ValueError):
    """A queue configuration is malformed."""


class FairUse(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fair-use keys a team or an org may set (None: not set here, inherited from the nearest org)."""

    max_pending_jobs: int | None = None
    submissions_per_minute: float | None = None
    submission_burst: int | None = None
    priorities: list[str] | None = None
    #: an interactive session with no keystroke and no output this long is ended (its job cancelled)
    interactive_idle_timeout_s: float | None = None
    #: an interactive session whose client went away is ended this long after, unless it attached again
    interactive_disconnect_grace_s: float | None = None


class TeamLimits(msgspec.Struct, frozen=True, kw_only=True):
    """A team's fair-use limits once inherited (None: unlimited). ``burst``: the bucket's size, a minute's
    worth of submissions unless the file says otherwise."""

    max_pending_jobs: int | None
    submissions_per_minute: float | None
    burst: int


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True


class Cohort(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str


class Org(FairUse, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    parent: str | None = None
    limit: int | None = None


class Team(FairUse, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    parent: str | None = None
    nominal: int = 0
    cohort: str = "default"
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    weight: float = 1.0
    max_priority: str | None = None
    #: guaranteed CPU cores and host memory (GiB) of the team's running tasks; others in its cohort may
    #: borrow what it leaves idle, as with GPUs. None: no quota of its own (docs/sharing.md, "Quotas")
    cpus: float | None = None
    memory_gib: float | None = None
    #: user -> fair-share weight inside the team (> 0; unlisted users weigh 1): among the team's jobs the
    #: policy orders equally, the user with the least decayed usage per weight goes first (``userusage``)
    users: dict[str, float] = {}
    #: GPUs reserved for the team's services (``kind: service``), out of its nominal: its services hold
    #: at most this many together, and one beyond it waits naming the service capacity. None: no cap
    service_gpus: int | None = None


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

    def inherited(self, team: str, key: str) -> Any:
        """A fair-use key's value for ``team``: its own, else its nearest org's that sets it (None: unset)."""
        holders: list[FairUse] = [self.team(team)]
        holders += [org for name in self.lineage(team) if (org := self.org(name)) is not None]
        for holder in holders:
            value = getattr(holder, key)
            if value is not None:
                return value
        return None

    def limits(self, team: str) -> TeamLimits:
        rate: float | None = self.inherited(team, "submissions_per_minute")
        burst: int | None = self.inherited(team, "submission_burst")
        return TeamLimits(
            max_pending_jobs=self.inherited(team, "max_pending_jobs"),
            submissions_per_minute=rate,
            burst=burst if burst is not None else max(1, math.ceil(rate or 1)),
        )

    def granted_priorities(self, team: str) -> list[str]:
        """The classes ``team`` may use, most important first (its ``max_priority`` may narrow them)."""
        values = self.class_values()
        listed: list[str] | None = self.inherited(team, "priorities")
        if listed is not None:
            granted = set(listed)
        elif self.team(team).max_priority is not None:
            granted = set(values)  # an explicit ceiling grants every class up to it, reserved ones too
        else:
            granted = set(values) - RESERVED_PRIORITIES
        return sorted(granted & values.keys(), key=lambda n: (-values[n], n))

    def priority_refusal(self, team: str, priority: str) -> str | None:
        """Why ``team`` may not submit at ``priority`` (None: it may): above its ``max_priority``, or not
        among its granted classes."""
        ceiling = self.team(team).max_priority
        values = self.class_values()
        if ceiling is not None and values.get(priority, 0) > values[ceiling]:
            allowed = sorted((n for n, v in values.items() if v <= values[ceiling]), key=lambda n: -values[n])
            return (
                f"team {team!r} may submit at priority {ceiling!r} or below ({', '.join(allowed)}); "
                f"{priority!r} is above it"
            )
        granted = self.granted_priorities(team)
        if priority in granted:
            return None
        why = "reserved; the queue file must grant it" if priority in RESERVED_PRIORITIES else "not granted"
        return (
            f"team {team!r} may not submit at priority {priority!r} ({why}); "
            f"its classes: {', '.join(granted) or 'none'}"
        )


def validate_queues(q: Queues) -> None:
    names = [t.name for t in q.teams]
    if len(set(names)) != len(names):
        raise QueuesError("duplicate team name")
    if any(t.nominal < 0 or t.weight <= 0 for t in q.teams):
        raise QueuesError("team nominal must be >= 0 and weight > 0")
    for t in q.teams:
        for field, value in (("cpus", t.cpus), ("memory_gib", t.memory_gib)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise QueuesError(f"team {t.name}: {field} must be a number >= 0, got {value}")
        for user, weight in sorted(t.users.items()):
            if not user.strip() or not (math.isfinite(weight) and weight > 0):
                raise QueuesError(f"team {t.name}: users.{user} must be a weight > 0, got {weight}")
        if t.service_gpus is not None and not 0 <= t.service_gpus <= t.nominal:
            # reserved room is guaranteed quota: a service never preempted must not sit on borrowed GPUs
            # that their lender may reclaim
            raise QueuesError(
                f"team {t.name}: service_gpus must be between 0 and its nominal {t.nominal}, "
                f"got {t.service_gpus}"
            )
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
    holders: list[tuple[str, FairUse]] = [(f"team {t.name}", t) for t in q.teams]
    holders += [(f"org {o.name}", o) for o in q.orgs]
    for where, holder in holders:
        _validate_fair_use(where, holder, class_names.keys())
    _validate_orgs(q)
    for t in q.teams:
        if q.inherited(t.name, "submission_burst") and not q.inherited(t.name, "submissions_per_minute"):
            raise QueuesError(
                f"team {t.name}: submission_burst without submissions_per_minute (its own or an org's)"
            )


def _validate_fair_use(where: str, holder: FairUse, classes: Collection[str]) -> None:
    """Each fair-use key positive, and ``priorities`` a non-empty list of distinct, known classes."""
    keys = ("max_pending_jobs", "submissions_per_minute", "submission_burst")
    for key in (*keys, "interactive_idle_timeout_s", "interactive_disconnect_grace_s"):
        value = getattr(holder, key)
        if value is not None and not value > 0:
            raise QueuesError(f"{where}: {key} must be > 0, got {value}")
    if holder.priorities is None:
        return
    if not holder.priorities:
        raise QueuesError(f"{where}: priorities must name at least one class (leave it out for the default)")
    if len(set(holder.priorities)) != len(holder.priorities):
        raise QueuesError(f"{where}: priorities lists a class twice")
    unknown = [p for p in holder.priorities if p not in classes]
    if unknown:
        raise QueuesError(f"{where}: priorities names {unknown[0]!r}, which is not a priority class")


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
