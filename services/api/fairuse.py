"""Fair use at submission: a team's cap on waiting jobs and its submission rate, from the queue file.

One team token could otherwise fill the log with thousands of jobs a second and push every other team's
work down the queue. The queue file (``scheduling/queues.py``) sets, per team or inherited from an org,
``max_pending_jobs`` and ``submissions_per_minute`` with ``submission_burst``; this module decides whether
a submission is within them. Beyond either the API answers 429 with ``Retry-After`` (``services/api/app.py``).

- The pending cap reads the fold: the team's jobs waiting for the scheduler (pending, not being cancelled:
  ``ClusterState.pending_count``, kept by the fold's index, so a check does not walk the queue), plus the
  ones this replica admitted that the fold has not applied yet (appending, or appended and not folded: the
  API answers 202 before its fold applies the job). Another replica's admissions of the last moments are
  not seen, so N replicas may overshoot by what they admit concurrently, never by more.
- The rate is a token bucket per team, in this replica's memory: N replicas behind a load balancer admit
  up to N times the rate. Sharing the bucket (a KV compare-and-set per submission) would cost a round trip
  to NATS on every submission, the API's hottest path.
- Admin tokens are not limited (an operator's override). A team the file does not limit costs nothing.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from rallypoint.scheduling.queues import Queues
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState

from .problems import problem

#: Retry-After for a full queue: when one of the team's jobs leaves it (bound, cancelled) is the
#: scheduler's to decide, so the client is told to come back in a while, not at a computed moment.
PENDING_RETRY_AFTER_S = 30
#: How long an admission counts towards the pending cap while the fold does not show its job: the append
#: was refused or failed in a way no handler saw. A live fold applies a job within milliseconds.
ADMISSION_TTL_S = 120.0

Clock = Callable[[], float]


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` held; a submission takes one. Starts full."""

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float) -> float:
        """Take a token: 0.0 when one was there, else the seconds until one will be (nothing taken)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s

    def _refill(self, now: float) -> None:
        # A clock that steps back (never with the monotonic clock) adds nothing rather than removing.
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate_per_s)
        self.updated = now


@dataclass(frozen=True, slots=True)
class Refusal:
    """A submission beyond a limit: which key of the queue file, why, and when to come back."""

    limit: str
    detail: str
    retry_after_s: int


class FairUse:
    """This replica's fair-use ledger: token buckets by team, admissions the fold has not applied yet,
    and refusals counted by team and limit (the ``rally_api_fair_use_refusals_total`` metric)."""

    def __init__(self, queues: Queues | None, clock: Clock = time.monotonic) -> None:
        self.queues = queues
        self.clock = clock
        self.buckets: dict[str, TokenBucket] = {}
        self.admitted: dict[str, tuple[str, float]] = {}  # job id -> (team, when admitted)
        self.refusals: Counter[tuple[str, str]] = Counter()

    def admit(self, who: Principal, team: str, job_id: str, state: ClusterState) -> Refusal | None:
        """Admit ``job_id`` for ``team`` (None) or say which limit refuses it. An admitted job counts as
        pending until the fold shows it, or ``withdraw`` is called because its append failed."""
        if who.admin or self.queues is None:
            return None
        limits = self.queues.limits(team)
        if limits.max_pending_jobs is None and limits.submissions_per_minute is None:
            return None
        refusal = self._over_pending_cap(team, limits.max_pending_jobs, state)
        if refusal is None and limits.submissions_per_minute is not None:
            refusal = self._over_rate(team, limits.submissions_per_minute, limits.burst)
        if refusal is not None:
            self.refusals[team, refusal.limit] += 1
            return refusal
        if limits.max_pending_jobs is not None:
            self.admitted[job_id] = (team, self.clock())
        return None

    def withdraw(self, job_id: str) -> None:
        """Forget an admission whose append the log did not acknowledge: it made no job."""
        self.admitted.pop(job_id, None)

    def count_refusal(self, team: str, limit: str) -> None:
        """Count a refusal decided elsewhere (a priority class the team was not granted)."""
        self.refusals[team, limit] += 1

    def _over_pending_cap(self, team: str, cap: int | None, state: ClusterState) -> Refusal | None:
        if cap is None:
            return None
        waiting = state.pending_count(team) + self._admitted_unfolded(team, state)
        if waiting < cap:
            return None
        return Refusal(
            "max_pending_jobs",
            f"team {team!r} has {waiting} jobs waiting, its max_pending_jobs is {cap}; "
            "submit again once some have started or been cancelled",
            PENDING_RETRY_AFTER_S,
        )

    def _over_rate(self, team: str, per_minute: float, burst: int) -> Refusal | None:
        now = self.clock()
        bucket = self.buckets.get(team)
        if bucket is None or (bucket.rate_per_s, bucket.burst) != (per_minute / 60.0, burst):
            bucket = self.buckets[team] = TokenBucket(per_minute / 60.0, burst, now)
        wait_s = bucket.take(now)
        if wait_s == 0.0:
            return None
        return Refusal(
            "submissions_per_minute",
            f"team {team!r} submits beyond its submissions_per_minute {per_minute:g} "
            f"(burst {burst}); retry in {wait_s:.1f} s",
            max(1, math.ceil(wait_s)),
        )

    def _admitted_unfolded(self, team: str, state: ClusterState) -> int:
        """This replica's admissions for ``team`` that the fold does not show yet; the ones it shows (or
        too old to be waiting for it) are forgotten, the fold counts them now."""
        expired = self.clock() - ADMISSION_TTL_S
        for job_id, (_, at) in list(self.admitted.items()):
            if job_id in state.jobs or at < expired:
                del self.admitted[job_id]
        return sum(1 for owner, _ in self.admitted.values() if owner == team)


def too_many(refusal: Refusal) -> web.Response:
    """The 429 of a refusal: problem+json naming the queue file's key, ``Retry-After`` in seconds."""
    return problem(
        429,
        "Fair-use limit reached",
        refusal.detail,
        slug="fair-use-limit",
        headers={"Retry-After": str(refusal.retry_after_s)},
        limit=refusal.limit,
        retry_after_s=refusal.retry_after_s,
    )


def refusal_metrics(refusals: Counter[tuple[str, str]]) -> str:
    """Prometheus text: submissions refused for fair use, by team and by the queue file's key."""
    name = "rally_api_fair_use_refusals_total"
    lines = [
        f"# HELP {name} Submissions refused by a fair-use limit of the queue file, by team and limit.",
        f"# TYPE {name} counter",
    ]
    for (team, limit), count in sorted(refusals.items()):
        lines.append(f'{name}{{team="{team}",limit="{limit}"}} {count}')
    return "\n".join(lines) + "\n"
