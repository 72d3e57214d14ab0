"""Fair share between the users of a team: org -> team -> user, as Slurm's fair-share tree account -> user.

A user's usage is the GPU-seconds their jobs in the team held, decayed with a half-life (Slurm's
``PriorityDecayHalfLife``, 7 days by default there too): what a user ran last week weighs half of what
they ran today. Among a team's jobs that the policy would otherwise order equally, the user with the least
usage per unit of weight (the queue file's ``users: {alice: 2}``, default 1) goes first.

The representation is chosen so that every fold of one log, the live one, the audit's and the
simulator's, gives the same numbers whatever order attempts end in:

- an ended attempt is billed as whole GPU-seconds into day buckets (``bill``): integer sums do not depend
  on the order of the additions;
- a running attempt is kept as its (start, GPUs) and billed only when the core reads it;
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
    "UserLedger",
    "UserUsage",
    "bill",
    "decayed_gpu_s",
    "usage_rows",
    "user_keys",
]

DAY_S = 86_400.0
HALF_LIFE_S = 7 * DAY_S
#: buckets older than this many days (8 half-lives: they would weigh under 0.4%) are ignored and dropped
HORIZON_DAYS = 56


class UserUsage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One user's usage in one team, as the core reads it (``Snapshot.user_usage``).

    ``days``: (day index since the clock's zero, GPU-seconds of ended attempts in that day), by day;
    ``running``: (start, GPUs) of the user's running attempts, sorted."""

    team: str
    user: str
    days: tuple[tuple[int, int], ...] = ()
    running: tuple[tuple[float, int], ...] = ()


class UserLedger(msgspec.Struct, kw_only=True):
    """A fold's record of one (team, user): ended attempts by day, running attempts by job id."""

    days: dict[int, int] = {}
    running: dict[str, tuple[float, int]] = {}


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


def start_attempt(ledger: UserLedger, job_id: str, start: float, gpus: int) -> None:
    ledger.running[job_id] = (start, gpus)


def end_attempt(ledger: UserLedger, job_id: str, end: float) -> None:
    """The job's running attempt ended at ``end``: bill it (nothing when it was not running)."""
    held = ledger.running.pop(job_id, None)
    if held is not None:
        bill(ledger.days, held[0], end, held[1])


def _weight(age: float) -> float:
    return 0.5 ** (age / HALF_LIFE_S) if age > 0 else 1.0


class _Decay:
    """The weight of each day inside the horizon at ``now`` (a day counts as of its end), and the weighted
    length of the full days from each day up to today: computed once per call and shared by every user,
    so a running attempt costs O(1) however many days it spans."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.today = day_of(now)
        self.first = self.today - HORIZON_DAYS
        self.w = [_weight(now - (d + 1) * DAY_S) for d in range(self.first, self.today + 1)]
        # full[i]: DAY_S x the weights of days first + i .. today - 1 (today is the partial one)
        self.full = [0.0] * (len(self.w) + 1)
        for i in range(len(self.w) - 2, -1, -1):
            self.full[i] = self.full[i + 1] + DAY_S * self.w[i]

    def held(self, start: float, gpus: int) -> float:
        """``gpus`` held from ``start`` until now, each day's part weighted (before the horizon: nothing)."""
        now = self.now
        if not now > start or gpus <= 0 or not math.isfinite(start):
            return 0.0
        ds = day_of(start)
        if ds < self.first:
            ds, start = self.first, self.first * DAY_S
        if ds >= self.today:
            return gpus * (now - start)
        i = ds - self.first
        first_day = ((ds + 1) * DAY_S - start) * self.w[i]
        return gpus * (first_day + self.full[i + 1] + (now - self.today * DAY_S))


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
        parts.extend([held(start, gpus) for start, gpus in u.running])
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
        running = tuple(sorted(ledger.running.values()))
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
