"""`rally schemas`: write one JSON Schema per event into schemas/ (a test fails when they drift)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec

from rallypoint.cli.output import add_output_args, emit
from rallypoint.events import ALL_EVENT_TYPES


def render_schemas() -> dict[str, str]:
    """File name -> file text, for every event in the catalogue."""
    out: dict[str, str] = {}
    for cls in ALL_EVENT_TYPES:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        schema = msgspec.json.schema(cls)
        schema["$id"] = f"https://rallypoint.dev/schemas/{tag}.json"
        schema["title"] = tag
        out[f"{tag}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    rendered = render_schemas()
    for stale in directory.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    written = []
    for name, text in sorted(rendered.items()):
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def _run(args: argparse.Namespace) -> int:
    written = [str(path) for path in write_schemas(Path(args.out))]
    return emit(args, written, "\n".join)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schemas", help="write the JSON Schema of every event")
    parser.add_argument("--out", default="schemas", help="directory to write into (default: schemas)")
    add_output_args(parser)
    parser.set_defaults(func=_run)
