"""Fair share between the users of a team (org -> team -> user): ``userusage`` and the orderers."""

from __future__ import annotations

import math

import pytest

from rallypoint.core import Queue, Quota, Snapshot, policy_by_name, schedule
from rallypoint.userusage import (
    DAY_S,
    HALF_LIFE_S,
    HORIZON_DAYS,
    UserLedger,
    UserUsage,
    bill,
    decayed_gpu_s,
    end_attempt,
    running_rows,
    start_attempt,
    usage_rows,
)

from .builders import ALL, cluster, nodes, pending, running

N2 = nodes(racks=1, per_rack=2)  # 16 GPUs
NOW = 30 * DAY_S
# the fair-share orderers: rallypoint's class + LAS order, and its DRF order without class_las
POLICIES = [("rallypoint", {}), ("rallypoint", {"class_las": False})]


def _snap(
    jobs: list, usage: tuple[UserUsage, ...], queues: tuple[Queue, ...] = (), now: float = NOW
) -> Snapshot:
    # one node busy: only one of the two 8-GPU jobs fits, the order decides which
    return Snapshot(
        now=now,
        cluster=cluster(N2, [running("r", {"s0r0n0": ALL}, team="other", start_time=now)]),
        pending=tuple(jobs),
        queues=queues,
        user_usage=usage,
    )


def _bound(snap: Snapshot, name: str, overrides: dict) -> set[str]:
    return {b.job_id for b in schedule(snap, policy_by_name(name, overrides)).binds}


def _heavy(user: str, gpu_s: int, team: str = "t") -> UserUsage:
    return UserUsage(team=team, user=user, days=((29, gpu_s),))


@pytest.mark.parametrize(("name", "overrides"), POLICIES)
def test_the_light_users_job_goes_first_though_submitted_later(name: str, overrides: dict) -> None:
    jobs = [pending("heavy-job", 8, submit=1, user="alice"), pending("light-job", 8, submit=2, user="bob")]
    snap = _snap(jobs, (_heavy("alice", 100_000), _heavy("bob", 1_000)))
    assert _bound(snap, name, overrides) == {"light-job"}
    # without usage the users are equal: submission order
    assert _bound(_snap(jobs, ()), name, overrides) == {"heavy-job"}


@pytest.mark.parametrize(("name", "overrides"), POLICIES)
def test_a_user_with_no_usage_row_has_used_nothing(name: str, overrides: dict) -> None:
    jobs = [pending("a1", 8, submit=1, user="alice"), pending("b1", 8, submit=2, user="bob")]
    assert _bound(_snap(jobs, (_heavy("alice", 10),)), name, overrides) == {"b1"}


@pytest.mark.parametrize(("name", "overrides"), POLICIES)
def test_weights_change_who_is_lighter(name: str, overrides: dict) -> None:
    jobs = [pending("a1", 8, submit=1, user="alice"), pending("b1", 8, submit=2, user="bob")]
    usage = (_heavy("alice", 30_000), _heavy("bob", 10_000))
    assert _bound(_snap(jobs, usage), name, overrides) == {"b1"}
    # alice weighs 4: 30,000 / 4 < 10,000 / 1
    weighted = (Queue(name="t", quotas=(Quota(nominal=16),), user_weights=(("alice", 4.0),)),)
    assert _bound(_snap(jobs, usage, weighted), name, overrides) == {"a1"}


@pytest.mark.parametrize(("name", "overrides"), POLICIES)
def test_priority_class_comes_before_the_users_share(name: str, overrides: dict) -> None:
    jobs = [
        pending("heavy-high", 8, submit=2, user="alice", priority_class="training-high"),
        pending("light-std", 8, submit=1, user="bob"),
    ]
    usage = (_heavy("alice", 10**7), _heavy("bob", 0))
    assert _bound(_snap(jobs, usage), name, overrides) == {"heavy-high"}


def test_the_team_share_comes_before_the_users_share() -> None:
    """A light user of a team above its fair share waits for a heavy user of a team below it."""
    c = cluster(N2, [running("r", {"s0r0n0": ALL}, team="big", start_time=NOW)])
    jobs = (
        pending("big-light", 8, submit=1, user="bob", team="big"),
        pending("small-heavy", 8, submit=2, user="alice", team="small"),
    )
    usage = (_heavy("alice", 10**6, team="small"),)
    snap = Snapshot(now=NOW, cluster=c, pending=jobs, user_usage=usage)
    assert {b.job_id for b in schedule(snap, policy_by_name("rallypoint", {"class_las": False})).binds} == {
        "small-heavy"
    }


def test_usage_decays_with_the_half_life() -> None:
    u = UserUsage(team="t", user="a", days=((0, 1000),))
    assert decayed_gpu_s(u, DAY_S) == 1000.0  # counted as of the day's end
    assert decayed_gpu_s(u, DAY_S + HALF_LIFE_S) == pytest.approx(500.0)
    assert decayed_gpu_s(u, (HORIZON_DAYS + 2) * DAY_S) == 0.0  # beyond the horizon
    # a running attempt counts as if it ended now
    r = UserUsage(team="t", user="a", running=running_rows([(0.0, 2)]))
    assert decayed_gpu_s(r, 100.0) == 200.0
    # over several days, as much as the same attempt billed by day once it ends now
    now = 40 * DAY_S + 5000.0
    days: dict[int, int] = {}
    bill(days, 37 * DAY_S - 3000.0, now, 8)
    running = UserUsage(team="t", user="a", running=running_rows([(37 * DAY_S - 3000.0, 8)]))
    ended = UserUsage(team="t", user="a", days=tuple(sorted(days.items())))
    assert decayed_gpu_s(running, now) == pytest.approx(decayed_gpu_s(ended, now), abs=8.0)


def test_billing_is_whole_gpu_seconds_by_day_and_order_free() -> None:
    a: dict[int, int] = {}
    bill(a, DAY_S - 10.0, DAY_S + 20.5, 2)
    assert a == {0: 20, 1: 41}
    b: dict[int, int] = {}
    spans = [(5.0, 17.3, 1), (2.2, 99.9, 3), (50.0, 60.0, 8)]
    for s in spans:
        bill(a, *s)
    for s in reversed(spans):
        bill(b, *s)
    bill(b, DAY_S - 10.0, DAY_S + 20.5, 2)
    assert a == b


def test_ledgers_bill_attempts_when_they_end_and_rows_keep_the_waiting_users() -> None:
    led = UserLedger()
    start_attempt(led, "j1", 0.0, 8)
    end_attempt(led, "j1", 100.0)
    end_attempt(led, "j1", 200.0)  # an attempt ends once
    start_attempt(led, "j2", 50.0, 1)
    ledgers = {("t", "alice"): led}
    rows = usage_rows(lambda t, u: ledgers.get((t, u)), [("t", "alice"), ("t", "bob"), ("t", None)], 300.0)
    assert rows == (UserUsage(team="t", user="alice", days=((0, 800),), running=running_rows([(50.0, 1)])),)
    assert math.isclose(decayed_gpu_s(rows[0], 300.0), 1050.0)


def _held_one_by_one(attempts: list[tuple[float, int]], now: float) -> float:
    """The running attempts' decayed GPU-seconds summed attempt by attempt, as billed if they ended now:
    the reference the sums by start day must equal."""
    days: dict[int, int] = {}
    for start, gpus in attempts:
        bill(days, start, now, gpus)
    return decayed_gpu_s(UserUsage(team="t", user="a", days=tuple(sorted(days.items()))), now)


def test_running_attempts_summed_by_start_day_count_as_one_by_one_in_one_row_per_day() -> None:
    now = 70 * DAY_S + 12_345.5
    # a thousand attempts over ten days, one started before the horizon, two today
    attempts = [((60 + i % 10) * DAY_S + 7.25 * i, 1 + i % 8) for i in range(1000)]
    attempts += [(3 * DAY_S, 4), (now - 100.0, 8), (now - 0.5, 2)]
    rows = running_rows(attempts)
    assert [day for day, _, _ in rows] == [3, *range(60, 70), 70]  # one row per start day
    got = decayed_gpu_s(UserUsage(team="t", user="a", running=rows), now)
    # billing rounds each day of each attempt to a whole GPU-second: a few thousand at most
    assert got == pytest.approx(_held_one_by_one(attempts, now), abs=len(attempts) * 8 * 2)
    # today's: exactly GPUs x (now - start)
    today = UserUsage(team="t", user="a", running=running_rows([(now - 100.0, 8), (now - 0.5, 2)]))
    assert decayed_gpu_s(today, now) == pytest.approx(801.0, abs=1e-5)
    # an attempt stamped after now by a clock ahead holds nothing yet
    assert decayed_gpu_s(UserUsage(team="t", user="a", running=running_rows([(now + 5.0, 8)])), now) == 0.0


def test_the_sums_by_start_day_do_not_depend_on_the_order_attempts_start_and_end() -> None:
    starts = [(f"j{i}", 40 * DAY_S + 0.1 * i * i, 1 + i % 5) for i in range(200)]
    forward, backward = UserLedger(), UserLedger()
    for job, start, gpus in starts:
        start_attempt(forward, job, start, gpus)
    for job, start, gpus in reversed(starts):
        start_attempt(backward, job, start, gpus)
    for job, _, _ in starts[::3]:
        end_attempt(forward, job, 41 * DAY_S)
    for job, _, _ in reversed(starts[::3]):
        end_attempt(backward, job, 41 * DAY_S)
    assert forward.by_day == backward.by_day
    assert forward.by_day == {
        d: [g, s] for d, g, s in running_rows([(s, g) for j, s, g in starts if (j, s, g) not in starts[::3]])
    }
    # a job's new attempt without the old one's end replaces it; the last end empties the day
    start_attempt(forward, "j1", 40 * DAY_S + 9.0, 3)
    assert forward.running["j1"] == (40 * DAY_S + 9.0, 3)
    for job in list(forward.running):
        end_attempt(forward, job, 42 * DAY_S)
    assert forward.by_day == {} and forward.running == {}
