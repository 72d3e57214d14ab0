"""A submission's tolerations and affinity rules (``jobs.placement_rules``): kept when good, refused naming
the field when not."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.events import Affinity
from rallypoint.jobs.validate import SpecError, validate_spec


def _body(**extra: Any) -> dict[str, Any]:
    return {"name": "web", "team": "nlp", "gpus": 1, "command": ["serve"], **extra}


def test_good_rules_are_kept_sorted_and_defaulted() -> None:
    got = validate_spec(
        _body(
            tolerations=["pool=serve", "dedicated", "pool=serve"],
            affinity=[{"group": "web", "level": "rack", "anti": True}, {"group": "cache"}],
        )
    )
    assert got.tolerations == ("dedicated", "pool=serve")
    assert got.affinity == (Affinity(group="web", level="rack", anti=True), Affinity(group="cache"))


@pytest.mark.parametrize(
    ("extra", "field", "detail"),
    [
        ({"tolerations": "pool=serve"}, "tolerations", "must be a list"),
        ({"tolerations": ["a b"]}, "tolerations[0]", "is not 'key=value' or 'key'"),
        ({"tolerations": ["k=v=w"]}, "tolerations[0]", "is not 'key=value' or 'key'"),
        ({"tolerations": [f"k{i}" for i in range(17)]}, "tolerations", "at most 16"),
        ({"affinity": {"group": "web"}}, "affinity", "must be a list"),
        ({"affinity": ["web"]}, "affinity[0]", "must be an object"),
        ({"affinity": [{"group": ""}]}, "affinity[0].group", "must be 1-63"),
        (
            {"affinity": [{"group": "web", "level": "spine"}]},
            "affinity[0].level",
            "must be one of node, rack",
        ),
        ({"affinity": [{"group": "web", "anti": "yes"}]}, "affinity[0].anti", "must be true or false"),
        ({"affinity": [{"group": "web", "zone": "a"}]}, "affinity[0].zone", "unknown field"),
        ({"affinity": [{"group": "web"}, {"group": "web", "anti": True}]}, "affinity[1].group", "one rule"),
    ],
)
def test_a_bad_rule_names_its_field(extra: dict[str, Any], field: str, detail: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(_body(**extra))
    assert err.value.field == field and detail in err.value.detail, err.value
