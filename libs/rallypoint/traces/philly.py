"""Philly job list (``philly_open.csv`` and the golden slice) -> canonical workload.

Columns: ``timestamp`` (local time string), ``duration`` (s), ``num_gpus``, ``gpu_time``, ``cluster`` (the
VC).
Philly has no priority, no user and no runtime estimate; the converter can add them deterministically
(see :func:`assign_priorities`, :func:`time_limit_ladder`) so policies that need them have something to read.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rallypoint.sim.workload import Job

TS_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True, slots=True)
class PhillyRow:
    row: int  # index in the file, 0-based, header excluded
    timestamp: datetime
    duration: float
    gpus: int
    vc: str


def parse_ts(s: str) -> datetime:
    return datetime.strptime(s.strip(), TS_FORMAT)


def read_rows(path: str | Path) -> list[PhillyRow]:
    """Read a Philly-format CSV in file order; a bad row raises ValueError naming the line."""
    rows: list[PhillyRow] = []
    p = Path(path)
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"timestamp", "duration", "num_gpus", "cluster"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            raise ValueError(f"{p}: not a Philly job list (need columns {sorted(need)})")
        for i, r in enumerate(reader):
            try:
                rows.append(
                    PhillyRow(
                        i,
                        parse_ts(r["timestamp"]),
                        float(r["duration"]),
                        int(float(r["num_gpus"])),
                        r["cluster"].strip(),
                    )
                )
            except (ValueError, TypeError) as e:
                raise ValueError(f"{p}:{i + 2}: {e}") from None
    return rows


def read_vc_sizes(path: str | Path) -> dict[str, int]:
    """``philly_vc.csv``: VC -> size in 8-GPU nodes."""
    out: dict[str, int] = {}
    with Path(path).open(newline="") as f:
        for r in csv.DictReader(f):
            out[r["vc"].strip()] = int(r["node num"])
    return out


def select(
    rows: Sequence[PhillyRow],
    start: datetime | None = None,
    end: datetime | None = None,
    vcs: Sequence[str] | None = None,
) -> list[PhillyRow]:
    """Rows submitted in ``[start, end)`` (optionally only some VCs), stable-sorted by submit time."""
    keep = [
        r
        for r in rows
        if (start is None or r.timestamp >= start)
        and (end is None or r.timestamp < end)
        and (not vcs or r.vc in vcs)
        and r.duration > 0
        and r.gpus > 0
    ]
    keep.sort(key=lambda r: r.timestamp)  # stable: ties keep file order, as the golden peers do
    return keep


def to_jobs(
    rows: Sequence[PhillyRow],
    origin: datetime | None = None,
    id_prefix: str = "",
    integer_seconds: bool = True,
) -> list[Job]:
    """Canonical jobs; t = 0 is ``origin`` (default: the first row's submit, the golden rule)."""
    if not rows:
        return []
    t0 = origin if origin is not None else rows[0].timestamp
    width = max(5, len(str(rows[-1].row)))
    jobs = []
    for r in rows:
        submit = (r.timestamp - t0).total_seconds()
        dur = float(round(r.duration)) if integer_seconds else r.duration
        # Philly has 12-GPU jobs: tasks of the largest size <= 8 that divides the gang (2 x 6 GPUs)
        tpt = max(d for d in range(1, 9) if r.gpus % d == 0)
        jobs.append(
            Job(
                id=f"{id_prefix}{r.row:0{width}d}",
                submit=submit,
                gpus=r.gpus,
                duration=max(dur, 1.0),
                team=r.vc,
                gpus_per_task=tpt if tpt != min(r.gpus, 8) else None,
            )
        )
    return jobs


# A Slurm-like ladder of requested wall times: users round their estimate up to a familiar value.
_LADDER = (
    600.0,
    1800.0,
    3600.0,
    2 * 3600.0,
    4 * 3600.0,
    8 * 3600.0,
    12 * 3600.0,
    24 * 3600.0,
    48 * 3600.0,
    72 * 3600.0,
    7 * 86400.0,
    14 * 86400.0,
    28 * 86400.0,
    56 * 86400.0,
)


def time_limit_ladder(duration: float) -> float:
    for v in _LADDER:
        if duration <= v:
            return v
    return float(int(duration) + 1)


def assign_priorities(jobs: Sequence[Job], mix: Sequence[tuple[str, float]], seed: int) -> list[Job]:
    """Give each job a priority class drawn from ``mix`` with a seeded generator keyed by job id.

    Keyed by id (not position) so the class of a job does not change when the window or the VC filter changes.
    """
    import msgspec

    total = sum(w for _, w in mix)
    out = []
    for j in jobs:
        u = random.Random(f"{seed}:{j.id}").random() * total
        acc = 0.0
        name = mix[-1][0]
        for cls, w in mix:
            acc += w
            if u < acc:
                name = cls
                break
        out.append(msgspec.structs.replace(j, priority=name))
    return out
