"""The committed JSON Schemas must match the catalogue: `make schemas` regenerates them."""

from __future__ import annotations

from pathlib import Path

from rallypoint.cli.schemas import render_schemas
from rallypoint.events import ALL_EVENT_TYPES

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_every_event_has_a_committed_schema_that_matches() -> None:
    rendered = render_schemas()
    assert len(rendered) == len(ALL_EVENT_TYPES)
    committed = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    missing = sorted(set(rendered) - set(committed))
    extra = sorted(set(committed) - set(rendered))
    drifted = sorted(name for name in rendered if name in committed and committed[name] != rendered[name])
    assert not missing, f"run `make schemas`: no schema committed for {missing}"
    assert not extra, f"run `make schemas`: schemas for events that no longer exist: {extra}"
    assert not drifted, f"run `make schemas`: schemas drifted from the catalogue: {drifted}"


def test_every_tag_carries_a_version() -> None:
    for cls in ALL_EVENT_TYPES:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str) and tag.rsplit(".", 1)[-1].startswith("v"), tag
