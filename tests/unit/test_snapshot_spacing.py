"""Snapshots are spaced by what they cost: a save that costs more CPU than replaying the events since the
last one would is not worth making yet (``following.events_before_next_save``)."""

from __future__ import annotations

from rallypoint.runtime.following import REPLAY_S_PER_EVENT, TAIL_OVER_SAVE, events_before_next_save


def test_a_cheap_save_keeps_the_configured_spacing() -> None:
    assert events_before_next_save(10_000, 0.005) == 10_000  # a small cluster's fold: milliseconds
    assert events_before_next_save(5, 0.0) == 5  # RALLY_SNAPSHOT_EVERY in tests


def test_a_costly_save_waits_until_the_tail_it_spares_costs_more() -> None:
    # 12,500 nodes and ~10,000 jobs: 0.22-0.24 s to encode and hash the fold
    due = events_before_next_save(10_000, 0.24)
    assert due == 30_000
    # the replay a restart adds is then at most TAIL_OVER_SAVE saves' worth of CPU, ~0.5 s here
    assert due * REPLAY_S_PER_EVENT <= TAIL_OVER_SAVE * 0.24 + 1e-9
