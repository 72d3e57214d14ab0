"""Reading the project's JSON/YAML configuration files (clusters, queues) with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_structured(path: str | Path, what: str) -> Any:
    """Read a JSON or YAML file (by suffix; YAML also reads JSON) with a one-line error."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"cannot read {what} {p}: {e.strerror or e}") from None
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: not valid JSON/YAML: {first}") from None
