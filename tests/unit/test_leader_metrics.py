"""The cluster bench reads the scheduler leader's own instruments by name: the names it looks for are the
ones the leader exports, and two readings give the phase's cycle CPU and write rate."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from rallypoint.bench.leadermetrics import (
    LeaderReading,
    cycle_cpu_ms,
    parse_metrics,
    write_rate,
)
from rallypoint.observability.instruments import (
    SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS,
    SCHEDULER_EVENTS_WRITTEN,
    SCHEDULER_WRITE_SECONDS,
)


def _reading() -> LeaderReading:
    return parse_metrics(generate_latest(REGISTRY).decode())


def test_two_readings_of_the_exported_instruments_give_the_phase() -> None:
    before = _reading()
    SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS.observe(0.030)
    SCHEDULER_CYCLE_COMPUTE_CPU_SECONDS.observe(0.010)
    SCHEDULER_WRITE_SECONDS.observe(0.25)
    SCHEDULER_WRITE_SECONDS.observe(0.05)
    SCHEDULER_EVENTS_WRITTEN.inc(2400)
    SCHEDULER_EVENTS_WRITTEN.inc(600)
    after = _reading()

    assert after.cycles - before.cycles == 2
    assert cycle_cpu_ms(before, after) == 20.0
    assert write_rate(before, after) == {"writes": 2, "events": 3000, "seconds": 0.3, "events_per_s": 10000.0}


def test_a_phase_without_cycles_or_writes_has_no_rate() -> None:
    same = LeaderReading(cycle_cpu_s=1.0, cycles=3, write_s=0.5, writes=2, written=10)
    assert cycle_cpu_ms(same, same) is None
    assert write_rate(same, same)["events_per_s"] is None


def test_an_unreadable_leader_reads_as_zeros() -> None:
    assert parse_metrics("") == LeaderReading()
    assert parse_metrics('rally_scheduler_write_seconds_sum{x="y"} 3.0\n') == LeaderReading()
