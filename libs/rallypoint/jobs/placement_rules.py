"""Checks of a submission's placement rules beside its node selector: ``tolerations`` and ``affinity``
(``core.constraints`` applies them). Each refusal is a ``SpecError`` naming the field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rallypoint.events import Affinity

from .text import SpecError

__all__ = [
    "GROUP_PATTERN",
    "MAX_AFFINITY_RULES",
    "MAX_TOLERATIONS",
    "TAINT_PATTERN",
    "check_affinity",
    "check_labels",
    "check_taints",
    "check_tolerations",
]

#: ``key`` or ``key=value``, each part as a node label's (1-63 letters, digits, ``.``, ``_``, ``/``, ``-``)
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?"
TAINT_PATTERN = re.compile(rf"^{_PART}(?:={_PART})?$")
GROUP_PATTERN = re.compile(rf"^{_PART}$")
MAX_TOLERATIONS = 16
MAX_AFFINITY_RULES = 8
_LEVELS = ("node", "rack")


def check_taints(value: object, field: str) -> tuple[str, ...]:
    """A list of ``key=value`` or ``key`` strings (a node's taints or a job's tolerations), sorted, each
    once."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise SpecError(field, f"must be a list of 'key=value' or 'key' strings, got {type(value).__name__}")
    if len(value) > MAX_TOLERATIONS:
        raise SpecError(field, f"at most {MAX_TOLERATIONS}, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not TAINT_PATTERN.fullmatch(item):
            shown = item if not isinstance(item, str) or len(item) <= 64 else f"{item[:64]}..."
            raise SpecError(
                f"{field}[{i}]",
                f"{shown!r} is not 'key=value' or 'key' (1-63 letters, digits, '.', '_', '/' or '-' each)",
            )
    return tuple(sorted(set(value)))


def check_labels(value: object, field: str) -> dict[str, str]:
    """An object of node labels (key -> value), each part as a label's (``TAINT_PATTERN``'s parts)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(field, f"must be an object of strings, got {type(value).__name__}")
    if len(value) > MAX_TOLERATIONS * 2:
        raise SpecError(field, f"at most {MAX_TOLERATIONS * 2} labels, got {len(value)}")
    for key, label in value.items():
        for what, text in (("key", key), ("value", label)):
            if not isinstance(text, str) or not GROUP_PATTERN.fullmatch(text):
                shown = text if not isinstance(text, str) or len(text) <= 64 else f"{text[:64]}..."
                raise SpecError(
                    f"{field}.{key}" if what == "value" and isinstance(key, str) else field,
                    f"label {what} {shown!r} is not 1-63 letters, digits, '.', '_', '/' or '-'",
                )
    return dict(value)


def check_tolerations(body: Mapping[str, Any]) -> tuple[str, ...]:
    return check_taints(body.get("tolerations"), "tolerations")


def check_affinity(body: Mapping[str, Any]) -> tuple[Affinity, ...]:
    """``[{group, level: node|rack, anti: bool}]``: at most one rule per group."""
    value = body.get("affinity")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise SpecError(
            "affinity", f"must be a list of {{group, level, anti}} objects, got {type(value).__name__}"
        )
    if len(value) > MAX_AFFINITY_RULES:
        raise SpecError("affinity", f"at most {MAX_AFFINITY_RULES} rules, got {len(value)}")
    rules = [_rule(item, f"affinity[{i}]") for i, item in enumerate(value)]
    groups = [r.group for r in rules]
    for i, group in enumerate(groups):
        if group in groups[:i]:
            raise SpecError(f"affinity[{i}].group", f"{group!r} has a rule already: one rule per group")
    return tuple(rules)


def _rule(item: object, field: str) -> Affinity:
    if not isinstance(item, Mapping):
        raise SpecError(field, f"must be an object {{group, level, anti}}, got {type(item).__name__}")
    unknown = sorted(set(item) - {"group", "level", "anti"})
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}", "unknown field (group, level and anti are known)")
    group = item.get("group")
    if not isinstance(group, str) or not GROUP_PATTERN.fullmatch(group):
        raise SpecError(f"{field}.group", "must be 1-63 letters, digits, '.', '_', '/' or '-'")
    level = item.get("level", "node")
    if level not in _LEVELS:
        raise SpecError(f"{field}.level", f"must be one of {', '.join(_LEVELS)}, got {level!r}")
    anti = item.get("anti", False)
    if not isinstance(anti, bool):
        raise SpecError(f"{field}.anti", f"must be true or false, got {type(anti).__name__}")
    return Affinity(group=group, level=level, anti=anti)
