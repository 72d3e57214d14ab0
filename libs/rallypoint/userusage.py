"""Fair share between the users of a team: org -> team -> user, as Slurm's fair-share tree account -> user.

A user's usage is the GPU-seconds their jobs in the team held, decayed with a half-life (Slurm's
``PriorityDecayHalfLife``, 7 days by default there too): what a user ran last week weighs half of what
they ran today. Among a team's jobs that the policy would otherwise order equally, the user with the least
usage per unit of weight (the queue file's ``users: {alice: 2}``, default 1) goes first.

The representation is chosen so that every fold of one log, the live one, the audit's and the
simulator's, gives the same numbers whatever order attempts end in:

- an ended attempt is billed as whole GPU-seconds into day buckets (``bill``): integer sums do not depend
  on the order of the additions;
- a running attempt is kept as its (start, GPUs), and summed by the day it started into integers
  (GPUs, and GPUs x start within the day in whole ``START_UNITS``) as attempts start and end: the core
  reads one row per start day however many attempts run (a cycle used to walk and sort every running
  attempt of every waiting user: 40 % of the leader's CPU with 20,000 running), and integer sums do not
  depend on order;
- the decay is applied only by the core, at the snapshot's ``now`` (``decayed_gpu_s``), summed with
  ``math.fsum`` (exactly rounded: no order there either).

The folds (``state.ClusterState`` live, ``sim.engine`` simulated) keep a :class:`UserLedger` per
(team, user) and hand the core the rows of the users with waiting jobs (``usage_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

import msgspec

__all__ = [
    "DAY_S",
    "HALF_LIFE_S",
    "HORIZON_DAYS",
    "START_UNITS",
    "UserLedger",
    "UserUsage",
    "bill",
    "decayed_gpu_s",
    "running_by_day",
    "running_rows",
    "usage_rows",
    "user_keys",
]

DAY_S = 86_400.0
HALF_LIFE_S = 7 * DAY_S
#: buckets older than this many days (8 half-lives: they would weigh under 0.4%) are ignored and dropped
HORIZON_DAYS = 56
#: Units of a running attempt's start in the sums by day: 2**-20 s (about a microsecond) since the start of
#: its day, so that a start converts to the same integer on every fold, the sums are the same in any order,
#: and a day's sum stays within the 64 bits a snapshot (msgpack) holds for 200 million GPUs (seconds since
#: the epoch instead overflowed them past ~10,000 GPUs started in one day).
START_UNITS = 2**20
_DAY_UNITS = int(DAY_S) * START_UNITS

#: (day, GPUs, GPUs x start within the day in ``START_UNITS``): the running attempts that started on one
#: day, summed
RunningDay = tuple[int, int, int]


class UserUsage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One user's usage in one team, as the core reads it (``Snapshot.user_usage``).

    ``days``: (day index since the clock's zero, GPU-seconds of ended attempts in that day), by day;
    ``running``: the user's running attempts summed by the day they started (``RunningDay``), by day."""

    team: str
    user: str
    days: tuple[tuple[int, int], ...] = ()
    running: tuple[RunningDay, ...] = ()


class UserLedger(msgspec.Struct, kw_only=True):
    """A fold's record of one (team, user): ended attempts by day, running attempts by job id, and those
    summed by start day (``by_day``: day -> [GPUs, GPUs x start within the day in ``START_UNITS``], what
    the core reads). ``by_day`` is derived from ``running``: rebuilt from it whenever a ledger is made or
    decoded (a snapshot from before it existed reads right), and left out of the state hash."""

    days: dict[int, int] = {}
    running: dict[str, tuple[float, int]] = {}
    by_day: dict[int, list[int]] = {}

    def __post_init__(self) -> None:
        self.by_day = _sums_by_day(self.running.values())


def day_of(t: float) -> int:
    return math.floor(t / DAY_S)


def _pieces(start: float, end: float, gpus: int) -> Iterator[tuple[int, float]]:
    """(day, GPU-seconds) of ``gpus`` held from ``start`` to ``end``, split at day edges (only the last
    ``HORIZON_DAYS`` + 1 days of a longer span: the rest is ignored anyway)."""
    if not (end > start) or gpus <= 0 or not (math.isfinite(start) and math.isfinite(end)):
        return
    t = max(start, end - (HORIZON_DAYS + 1) * DAY_S)
    d = day_of(t)
    while t < end:
        edge = min(end, (d + 1) * DAY_S)
        if edge > t:
            yield d, gpus * (edge - t)
            t = edge
        d += 1


def bill(days: dict[int, int], start: float, end: float, gpus: int) -> None:
    """Add an ended attempt (``gpus`` held from ``start`` to ``end``) to ``days``, in whole GPU-seconds per
    day; drop the days beyond the horizon of ``end``."""
    for d, gpu_s in _pieces(start, end, gpus):
        whole = round(gpu_s)
        if whole:
            days[d] = days.get(d, 0) + whole
    cut = day_of(end) - HORIZON_DAYS if math.isfinite(end) else None
    if cut is not None:
        for old in [d for d in days if d < cut]:
            del days[old]


def _sum_by_day(by_day: dict[int, list[int]], start: float, gpus: int, sign: int) -> None:
    """Add (``sign`` 1) or take back (-1) an attempt of ``gpus`` from ``start`` in the sums by start day.
    An attempt that could hold nothing (no GPUs, a start that is not a time) is in none."""
    if gpus <= 0 or not math.isfinite(start):
        return
    day = day_of(start)
    sums = by_day.setdefault(day, [0, 0])
    sums[0] += sign * gpus
    sums[1] += sign * gpus * _units_into(day, start)
    if not sums[0]:  # the day's last attempt ended: its GPU x start sum is back to exactly 0 too
        del by_day[day]


def _units_into(day: int, t: float) -> int:
    """``t``'s time since the start of ``day`` (its day), in whole ``START_UNITS``: the same integer on
    every machine (and the subtraction exact for times since 1970: a time and the start of its own day
    are within a factor of two of each other, or the day is 0)."""
    return round((t - day * DAY_S) * START_UNITS)


def start_attempt(ledger: UserLedger, job_id: str, start: float, gpus: int) -> None:
    previous = ledger.running.get(job_id)
    if previous is not None:  # a new attempt without the old one's end: it replaces it
        _sum_by_day(ledger.by_day, previous[0], previous[1], -1)
    ledger.running[job_id] = (start, gpus)
    _sum_by_day(ledger.by_day, start, gpus, 1)


def end_attempt(ledger: UserLedger, job_id: str, end: float) -> None:
    """The job's running attempt ended at ``end``: bill it (nothing when it was not running)."""
    held = ledger.running.pop(job_id, None)
    if held is not None:
        _sum_by_day(ledger.by_day, held[0], held[1], -1)
        bill(ledger.days, held[0], end, held[1])


def _sums_by_day(attempts: Iterable[tuple[float, int]]) -> dict[int, list[int]]:
    """These (start, GPUs) attempts summed by start day, as ``UserLedger.by_day`` holds them."""
    by_day: dict[int, list[int]] = {}
    for start, gpus in attempts:
        _sum_by_day(by_day, start, gpus, 1)
    return by_day


def _rows(by_day: dict[int, list[int]]) -> tuple[RunningDay, ...]:
    return tuple(sorted((day, gpus, starts) for day, (gpus, starts) in by_day.items()))


def running_by_day(ledger: UserLedger) -> tuple[RunningDay, ...]:
    """The ledger's running attempts as ``UserUsage.running`` holds them."""
    return _rows(ledger.by_day)


def running_rows(attempts: Iterable[tuple[float, int]]) -> tuple[RunningDay, ...]:
    """``UserUsage.running`` for these (start, GPUs) attempts."""
    return _rows(_sums_by_day(attempts))


def _weight(age: float) -> float:
    return 0.5 ** (age / HALF_LIFE_S) if age > 0 else 1.0


class _Decay:
    """The weight of each day inside the horizon at ``now`` (a day counts as of its end), and the weighted
    length of the full days from each day up to today: computed once per call and shared by every user,
    so a start day's running attempts cost O(1) however many days they span."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.today = day_of(now)
        self.first = self.today - HORIZON_DAYS
        self.w = [_weight(now - (d + 1) * DAY_S) for d in range(self.first, self.today + 1)]
        # full[i]: DAY_S x the weights of days first + i .. today - 1 (today is the partial one)
        self.full = [0.0] * (len(self.w) + 1)
        for i in range(len(self.w) - 2, -1, -1):
            self.full[i] = self.full[i + 1] + DAY_S * self.w[i]

    def held(self, day: int, gpus: int, starts: int) -> float:
        """``gpus`` summed over the attempts that started on ``day`` (``starts``: their GPUs x start within
        the day, in ``START_UNITS``), held until now, each day's part weighted (before the horizon:
        nothing). Exact integers up to the one division, whatever the number of attempts."""
        partial = self.now - self.today * DAY_S  # of today, the part gone by
        if day > self.today:
            return 0.0  # started after now (another machine's clock ahead): nothing held yet
        if day == self.today:
            held = gpus * _units_into(day, self.now) - starts
            return held / START_UNITS if held > 0 else 0.0
        if day < self.first:  # from the horizon on: the whole first day
            return gpus * (DAY_S * self.w[0] + self.full[1] + partial)
        i = day - self.first
        first_day = (gpus * _DAY_UNITS - starts) / START_UNITS * self.w[i]
        return first_day + gpus * (self.full[i + 1] + partial)


def decayed_gpu_s(u: UserUsage, now: float, decay: _Decay | None = None) -> float:
    """The user's GPU-seconds at ``now``: each day's counted as of the day's end, halved per half-life
    since; running attempts as if they ended now. ``decay``: the day weights at ``now``, when the caller
    already has them."""
    dw = decay if decay is not None and decay.now == now else _Decay(now)
    first, today, w = dw.first, dw.today, dw.w
    # (dw.day inlined: this runs for every day of every waiting user, every cycle)
    parts = [gpu_s * (w[d - first] if d <= today else 1.0) for d, gpu_s in u.days if d >= first]
    if u.running:
        held = dw.held
        parts.extend([held(day, gpus, starts) for day, gpus, starts in u.running])
    return math.fsum(parts)


def usage_rows(
    ledgers: Callable[[str, str], UserLedger | None], waiting: Iterable[tuple[str, str | None]], now: float
) -> tuple[UserUsage, ...]:
    """The rows the core needs: one per (team, user) of the ``waiting`` jobs' (team, user) pairs with any
    usage, sorted, with the days inside the horizon of ``now`` only (every fold hands the same rows)."""
    first = day_of(now) - HORIZON_DAYS
    rows = []
    for team, user in sorted({(t, u) for t, u in waiting if u is not None}):
        ledger = ledgers(team, user)
        if ledger is None:
            continue
        days = tuple(sorted((d, g) for d, g in ledger.days.items() if d >= first))
        running = running_by_day(ledger)
        if days or running:
            rows.append(UserUsage(team=team, user=user, days=days, running=running))
    return tuple(rows)


def user_keys(
    rows: Iterable[UserUsage], weights: Mapping[str, Mapping[str, float]], now: float
) -> dict[tuple[str, str], float]:
    """(team, user) -> decayed GPU-seconds per unit of the user's weight in the team (default 1). Users
    without a row have 0: they go first."""
    keys = {}
    decay: _Decay | None = None
    for u in rows:
        if decay is None:
            decay = _Decay(now)
        w = weights.get(u.team, {}).get(u.user, 1.0)
        keys[(u.team, u.user)] = decayed_gpu_s(u, now, decay) / max(w, 1e-9)
    return keys
