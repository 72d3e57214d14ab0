"""openb pods with the times they were recorded at: when each arrived and when it left.

``read_pods`` (trace.py) gives each row's request; this adds the row's ``creation_time`` and
``deletion_time`` (seconds from the start of the trace). A pod's recorded lifetime is ``deletion_time -
creation_time``: a pod that started at once would leave at its ``deletion_time``. Every row is kept, pods
that never ran (``pod_phase`` Pending) included, as the FGD protocol keeps them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from rallypoint.sim.packing.trace import PodSpec, read_pods


@dataclass(frozen=True, slots=True)
class TimedPod:
    spec: PodSpec
    created: float
    deleted: float

    @property
    def lifetime(self) -> float:
        return self.deleted - self.created


def _time(row: dict[str, str | None], key: str) -> float:
    if key not in row:
        raise ValueError(f"missing column {key!r}")
    text = (row[key] or "").strip()
    if not text:
        raise ValueError(f"empty {key}")
    value = float(text)
    if not value >= 0:  # also NaN
        raise ValueError(f"{key} {text!r} is not a time >= 0")
    return value


def read_timed_pods(path: str | Path) -> list[TimedPod]:
    """Every pod of the file in file order, with its creation and deletion time."""
    p = Path(path)
    specs = read_pods(p)
    out: list[TimedPod] = []
    with p.open(newline="") as f:
        for i, (row, spec) in enumerate(zip(csv.DictReader(f), specs, strict=True)):
            try:
                created, deleted = _time(row, "creation_time"), _time(row, "deletion_time")
            except ValueError as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
            if deleted < created:
                raise ValueError(f"{p}:{i + 2}: deletion_time {deleted:g} before creation_time {created:g}")
            out.append(TimedPod(spec, created, deleted))
    return out
