"""GPUs in use per team over time (services/api/usage_history.py): buckets, the window, the bounds."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from rallypoint_services.api.usage_history import (
    DEFAULT_WINDOW_S,
    MAX_BUCKETS,
    TARGET_BUCKETS,
    UsageHistory,
    auto_step,
    bucket_starts,
    usage_history,
)

from rallypoint.accounting import fold_attempts, usage
from rallypoint.accounting.attempts import AttemptRecord
from rallypoint.events import Event

HISTORY = Path(__file__).parents[1] / "replay" / "data" / "history.jsonl"


def attempt(
    job_id: str, gpus: int, started: float | None, ended: float | None, team: str = "nlp"
) -> AttemptRecord:
    return AttemptRecord(
        job_id=job_id, attempt=1, team=team, user=team, priority="training-standard", gpus=gpus,
        placements=(), bound_at=started if started is not None else 0.0, started_at=started, ended_at=ended,
    )  # fmt: skip


def series(history: UsageHistory) -> dict[str, list[float]]:
    return {t.team: t.gpus for t in history.teams}


def test_a_bucket_holds_the_average_gpus_in_use_during_it() -> None:
    # 4 GPUs from 30 s to 150 s: half of the first minute, all of the second, half of the third
    history = usage_history([attempt("a", 4, 30.0, 150.0)], since=0.0, until=180.0, step_s=60, now=500.0)
    assert history.starts == [0.0, 60.0, 120.0]
    assert series(history) == {"nlp": [2.0, 4.0, 2.0]}
    assert history.teams[0].gpu_s == 480.0


def test_teams_are_apart_in_name_order_and_a_team_that_ran_nothing_in_the_window_is_left_out() -> None:
    records = [
        attempt("v", 8, 0.0, 60.0, team="vision"),
        attempt("d", 2, 0.0, 120.0, team="demo"),
        attempt("d2", 2, 60.0, 120.0, team="demo"),
        attempt("old", 8, 0.0, 10.0, team="bench"),  # ended before the window
        attempt("waiting", 8, None, None, team="nlp"),  # bound, never started: charged nothing
    ]
    history = usage_history(records, since=30.0, until=120.0, step_s=30, now=500.0)
    assert [t.team for t in history.teams] == ["demo", "vision"]
    assert series(history) == {"demo": [2.0, 4.0, 4.0], "vision": [8.0, 0.0, 0.0]}


def test_a_running_attempt_counts_up_to_now_and_the_last_bucket_ends_at_until() -> None:
    history = usage_history([attempt("r", 8, 0.0, None)], since=0.0, until=90.0, step_s=60, now=90.0)
    assert history.starts == [0.0, 60.0] and history.until == 90.0
    assert series(history) == {"nlp": [8.0, 8.0]}  # 240 GPU-s over the last bucket's 30 s
    assert history.teams[0].gpu_s == 720.0


def test_buckets_are_aligned_to_the_step_so_every_refresh_draws_the_same_ones() -> None:
    assert bucket_starts(61.0, 200.0, 60) == [60.0, 120.0, 180.0]
    first = usage_history([attempt("a", 1, 0.0, None)], since=61.0, until=200.0, step_s=60, now=200.0)
    later = usage_history([attempt("a", 1, 0.0, None)], since=75.0, until=230.0, step_s=60, now=230.0)
    assert first.since == later.since == 60.0 and first.starts == later.starts


def test_the_default_window_starts_at_the_first_gpu_use_of_the_last_six_hours() -> None:
    young = usage_history([attempt("a", 4, 1000.0, None)], until=1120.0, now=1120.0)
    assert young.since == 1000.0 and young.step_s == 1.0  # 2 minutes: a bucket a second
    old = usage_history([attempt("a", 4, 0.0, None)], until=100_000.0, now=100_000.0)
    assert old.step_s == 60.0 and len(old.starts) == TARGET_BUCKETS + 1  # +1: the aligned first bucket
    assert old.since <= 100_000.0 - DEFAULT_WINDOW_S < old.since + 60
    empty = usage_history([], until=5000.0, now=5000.0)
    assert empty.teams == [] and empty.since <= 5000.0 - DEFAULT_WINDOW_S < empty.since + 60


@pytest.mark.parametrize("span", [1.0, 359.0, 3600.0, 6 * 3600.0, 30 * 86400.0, 20 * 365 * 86400.0])
def test_an_automatic_step_keeps_any_window_within_the_target(span: float) -> None:
    assert span / auto_step(span) <= TARGET_BUCKETS
    history = usage_history([attempt("a", 1, 0.0, None)], since=0.0, until=span, now=span)
    assert len(history.starts) <= TARGET_BUCKETS + 1
    assert all(len(t.gpus) == len(history.starts) for t in history.teams)


def test_a_step_too_fine_is_widened_one_too_long_narrowed_and_an_empty_window_has_no_buckets() -> None:
    fine = usage_history([attempt("a", 1, 0.0, None)], since=0.0, until=86_400.0 * 2, step_s=60, now=0.0)
    assert fine.step_s == 120.0 and len(fine.starts) == MAX_BUCKETS
    huge = usage_history([attempt("a", 2, 0.0, None)], since=0.0, until=600.0, step_s=10**400, now=600.0)
    assert huge.step_s == 600.0 and series(huge) == {"nlp": [2.0]}
    empty = usage_history([attempt("a", 1, 0.0, None)], since=100.0, until=50.0, now=100.0)
    assert empty.starts == [] and empty.teams == []


def recorded() -> list[tuple[int, Event]]:
    return [
        (item["seq"], msgspec.json.decode(json.dumps(item["event"]), type=Event))
        for item in map(json.loads, HISTORY.read_text().splitlines())
    ]


def test_on_the_recorded_history_the_buckets_add_up_to_the_usage_report_of_the_same_window() -> None:
    _, ledger = fold_attempts(recorded())
    records = list(ledger.records())
    ends = [r.ended_at for r in records if r.ended_at is not None]
    until, now = max(ends), max(ends) + 5.0
    history = usage_history(records, since=min(r.bound_at for r in records), until=until, step_s=1, now=now)
    report = usage(records, "team", history.since, until, now=now)
    assert {t.team: t.gpu_s for t in history.teams} == {
        row.key: pytest.approx(row.gpu_s) for row in report.rows if row.gpu_s > 0
    }
    for team in history.teams:
        widths = [*(b - a for a, b in zip(history.starts, history.starts[1:], strict=False)), 1.0]
        widths[-1] = until - history.starts[-1]
        assert sum(g * w for g, w in zip(team.gpus, widths, strict=True)) == pytest.approx(team.gpu_s)
