"""Which settings each recorded decision is replayed under: the ones its scheduler leader recorded.

A scheduler leader records what it decides with (``SchedulerSettings``: the policy, the queue
configuration, the repair wait) on its fenced tree before its first decision of an epoch, so the audit
replays every decision of that epoch under them. A decision of an epoch that recorded none (a log written
before the record existed, or a legacy preemption service's request) is replayed under the fallback: the
defaults, or the settings the caller names. Settings the caller names explicitly (``Overrides``) replace
the recorded ones, knob by knob. Pure: the caller supplies the history in log order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from rallypoint.core.types import PriorityClass, Queue
from rallypoint.events import Event, LeaderEpochStarted, SchedulerSettings
from rallypoint.events.codec import Quarantined
from rallypoint.scheduling import SchedulingPolicy
from rallypoint.state import Decision, decision_role


class Overrides(msgspec.Struct, frozen=True, kw_only=True):
    """Settings the caller gives explicitly (``rally replay --policy/--queues/--repair-wait``): each one
    replaces the recorded value of its knob. None: keep what the scheduler recorded."""

    policy: str | None = None
    queue_file: str | None = None
    queues: tuple[Queue, ...] | None = None
    priority_classes: tuple[PriorityClass, ...] | None = None
    repair_wait_s: float | None = None

    def flags(self) -> list[str]:
        """The flags that replace recorded values, as a user typed them."""
        given = {
            "--policy": self.policy,
            "--queues": self.queues,
            "--repair-wait": self.repair_wait_s,
        }
        return [flag for flag, value in given.items() if value is not None]


class SettingsSpan(msgspec.Struct, kw_only=True):
    """The settings one span of decisions was replayed under, as the report names them. ``seq`` is where
    the scheduler recorded them (0: nothing recorded, the fallback); ``overridden`` the flags that
    replaced recorded values; ``decisions`` how many decisions, reasons and repairs were judged here."""

    seq: int = 0
    epoch: int = 0
    policy_version: str
    queue_file: str | None = None
    repair_wait_s: float
    overridden: list[str] = []
    recorded_policy_version: str = ""  # what the scheduler's decisions say, when it differs
    decisions: int = 0


@dataclass
class Span:
    """A span's policy and repair wait, and what the report says of it."""

    policy: SchedulingPolicy
    repair_wait_s: float
    report: SettingsSpan


class SpanIndex:
    """The span each decision is replayed under: its epoch's recorded settings, or the fallback."""

    def __init__(
        self,
        history: Iterable[tuple[int, Event | Quarantined]],
        fallback: Span,
        overrides: Overrides,
    ) -> None:
        self.fallback = fallback
        self.by_epoch = {
            epoch: _recorded_span(seq, settings, overrides)
            for epoch, (seq, settings) in recorded_settings(history).items()
        }

    def of(self, event: Decision) -> Span:
        """The span ``event`` is replayed under, which counts it among the decisions it judged."""
        span = self.fallback
        if decision_role(event) == "scheduler":
            span = self.by_epoch.get(event.epoch, self.fallback)
        span.report.decisions += 1
        return span

    def spans(self) -> list[SettingsSpan]:
        """What the report lists: the fallback first when it judged anything (or nothing was recorded),
        then every recorded span in log order."""
        recorded = sorted((span.report for span in self.by_epoch.values()), key=lambda r: r.seq)
        if self.fallback.report.decisions or not recorded:
            return [self.fallback.report, *recorded]
        return recorded


def recorded_settings(
    history: Iterable[tuple[int, Event | Quarantined]],
) -> dict[int, tuple[int, SchedulerSettings]]:
    """Scheduler epoch -> (seq, settings) its leader recorded. Only a record of the epoch the fold holds
    at that point counts (a deposed leader's cannot land: its tree is fenced), and only its first."""
    epoch = 0
    found: dict[int, tuple[int, SchedulerSettings]] = {}
    for seq, item in history:
        if isinstance(item, LeaderEpochStarted) and item.role == "scheduler":
            epoch = max(epoch, item.epoch)  # as the fold takes epochs (``state.epochs``)
        elif isinstance(item, SchedulerSettings) and item.epoch == epoch and epoch not in found:
            found[epoch] = (seq, item)
    return found


def fallback_span(policy: SchedulingPolicy, repair_wait_s: float, overrides: Overrides) -> Span:
    """Where nothing was recorded: ``policy`` and ``repair_wait_s`` (the defaults or the caller's)."""
    report = SettingsSpan(
        policy_version=policy.version,
        queue_file=overrides.queue_file,
        repair_wait_s=repair_wait_s,
        overridden=overrides.flags(),
    )
    return Span(policy, repair_wait_s, report)


def _recorded_span(seq: int, settings: SchedulerSettings, overrides: Overrides) -> Span:
    policy = _recorded_policy(settings, overrides)
    repair_wait_s = settings.repair_wait_s if overrides.repair_wait_s is None else overrides.repair_wait_s
    queue_file = settings.queue_file if overrides.queues is None else overrides.queue_file
    report = SettingsSpan(
        seq=seq,
        epoch=settings.epoch,
        policy_version=policy.version,
        queue_file=queue_file,
        repair_wait_s=repair_wait_s,
        overridden=overrides.flags(),
        recorded_policy_version="" if policy.version == settings.policy_version else settings.policy_version,
    )
    return Span(policy, repair_wait_s, report)


def _recorded_policy(settings: SchedulerSettings, overrides: Overrides) -> SchedulingPolicy:
    """The recorded policy, its knobs replaced by the overrides. A policy or queue record this version
    cannot rebuild (a newer scheduler's) falls back to the defaults: its version then differs from the
    recorded one, and the span's decisions count as made under another policy."""
    name = overrides.policy or settings.policy
    try:
        queues = overrides.queues
        if queues is None:
            queues = msgspec.convert(settings.queues, tuple[Queue, ...])
        classes = overrides.priority_classes
        if classes is None:
            classes = msgspec.convert(settings.priority_classes, tuple[PriorityClass, ...])
        return SchedulingPolicy(name, queues=queues, priority_classes=classes)
    except (KeyError, msgspec.ValidationError):
        return SchedulingPolicy()
