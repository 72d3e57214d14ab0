"""The scheduler leader's own instruments, read from its ``/metrics`` by ``rally bench cluster``.

Two figures of a phase come from the difference of two readings: the CPU of each deciding cycle
(``rally_scheduler_cycle_compute_cpu_seconds``) and the rate the leader's fenced writes stored events at
(``rally_scheduler_events_written`` over the sum of ``rally_scheduler_write_seconds``): the time its
writes took from the batch's encode until its loop took the server's acknowledgement (what it folded
meanwhile included), nothing of deciding in it.
"""

from __future__ import annotations

import urllib.request
from typing import NamedTuple

CYCLE_CPU = "rally_scheduler_cycle_compute_cpu_seconds"
WRITE_SECONDS = "rally_scheduler_write_seconds"
WRITTEN = "rally_scheduler_events_written_total"


class LeaderReading(NamedTuple):
    """What the leader's instruments had counted at one moment (zeros where it could not be read)."""

    cycle_cpu_s: float = 0.0
    cycles: int = 0
    write_s: float = 0.0
    writes: int = 0
    written: int = 0


def parse_metrics(text: str) -> LeaderReading:
    """The reading in a Prometheus text exposition (samples without labels only)."""
    wanted = {
        f"{CYCLE_CPU}_sum": "cycle_cpu_s",
        f"{CYCLE_CPU}_count": "cycles",
        f"{WRITE_SECONDS}_sum": "write_s",
        f"{WRITE_SECONDS}_count": "writes",
        WRITTEN: "written",
    }
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            found[wanted[name]] = float(value)
    return LeaderReading(
        cycle_cpu_s=found.get("cycle_cpu_s", 0.0),
        cycles=int(found.get("cycles", 0)),
        write_s=found.get("write_s", 0.0),
        writes=int(found.get("writes", 0)),
        written=int(found.get("written", 0)),
    )


def read_leader(port: int | None) -> LeaderReading:
    """The leader's reading from its health port's ``/metrics`` (zeros if it does not answer)."""
    if port is None:
        return LeaderReading()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return parse_metrics(response.read().decode())
    except OSError:
        return LeaderReading()


def cycle_cpu_ms(before: LeaderReading, after: LeaderReading) -> float | None:
    """Mean CPU ms of the deciding cycles between two readings (None if there was none)."""
    cycles = after.cycles - before.cycles
    return round((after.cycle_cpu_s - before.cycle_cpu_s) * 1000 / cycles, 2) if cycles > 0 else None


def write_rate(before: LeaderReading, after: LeaderReading) -> dict[str, float | int | None]:
    """Between two readings: the writes, the events they stored, their time, and events per second of it."""
    seconds = after.write_s - before.write_s
    written = after.written - before.written
    return {
        "writes": after.writes - before.writes,
        "events": written,
        "seconds": round(seconds, 4),
        "events_per_s": round(written / seconds, 1) if seconds > 0 and written > 0 else None,
    }
