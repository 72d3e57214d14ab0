"""Runtimes learned from history: an online, deterministic estimator of a job's runtime quantiles.

The estimator sees a job only once it has ended (``observe``) and answers for a moment ``now``
(``estimate``); its clock only moves forward, so nothing that ended after ``now`` can be in an answer: an
``observe`` of an end earlier than a moment already answered for, or an ``estimate`` for a moment before
an end already seen, raises ``ValueError`` (what ended at ``now`` itself is known at ``now``: a cluster
frees GPUs before it schedules).

The method is the published one for batch schedulers without a learned model (Tsafrir et al.'s
user-history averages, 3Sigma's per-feature histories): per key, the runtimes of the last
``window`` ended jobs, and the quantiles of the most specific key that has at least ``min_samples`` of
them. Keys, most specific first: (user, name), (team, name), (team, command), (team, GPU class, time
limit), (team, time limit), (time limit), then for a job with a time limit the share of their limits
that like jobs used, times its own limit, over (team, GPU class), (team) and everything; then (team, GPU
class), (team), everything. A key with the time limit groups jobs that asked for the same wall time
(users round their estimate up to familiar values); a limit no ended job had yet is better answered by
how much of their limits like jobs used (users ask for a similar margin over what they need) than by
their runtimes whatever their limits. Every answer is capped at the job's time limit (the cluster stops
it there). Memory is bounded per key (``window`` runtimes).

A job already running for ``elapsed`` seconds is answered from the runtimes of its key that exceeded
``elapsed`` (a conditional quantile), so an estimate never ends a job in the past.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

import msgspec

__all__ = ["JobFeatures", "RuntimeEstimate", "RuntimeEstimator"]

# A job still running past every runtime its keys remember is expected to run this much longer, as a
# share of what it has run so far (the Pareto-like tail of job runtimes: the longer it ran, the longer
# it will run).
_TAIL_GROWTH = 0.5
# Answer with no history at all and no time limit: one hour, the commonest ladder step of Philly's list.
_NO_HISTORY_S = 3600.0


class JobFeatures(msgspec.Struct, frozen=True, kw_only=True):
    """What a cluster knows about a job at its submit; None where it has no such field. ``job_id`` is no
    key (ids never repeat): it lets a caller's own estimator (an oracle, in tests) tell jobs apart."""

    team: str
    gpus: int
    job_id: str | None = None
    user: str | None = None
    name: str | None = None
    command: str | None = None
    priority_class: str | None = None
    time_limit_s: float | None = None


class RuntimeEstimate(msgspec.Struct, frozen=True):
    """Runtime quantiles in seconds (``p50 <= p90``) and the key they came from."""

    p50: float
    p90: float
    key: str
    samples: int


def gpu_class(gpus: int) -> int:
    """Jobs of 1, 2, 3-4, 5-8, 9-16, ... GPUs share a class: the next power of two."""
    return 1 << max(0, gpus - 1).bit_length()


def _keys(f: JobFeatures) -> Iterator[tuple[str, tuple[object, ...]]]:
    """The keys of ``f``, most specific first; a key is (its kind, its values). The ``share`` kinds
    (``_SHARE_KINDS``) hold runtimes as shares of their jobs' time limits, for jobs that have one."""
    if f.user is not None and f.name is not None:
        yield "user+name", (f.user, f.name)
    if f.name is not None:
        yield "team+name", (f.team, f.name)
    if f.command is not None:
        yield "team+command", (f.team, f.command)
    if f.time_limit_s is not None:
        yield "team+gpus+limit", (f.team, gpu_class(f.gpus), f.time_limit_s)
        yield "team+limit", (f.team, f.time_limit_s)
        yield "limit", (f.time_limit_s,)
        yield "team+gpus+share", (f.team, gpu_class(f.gpus))
        yield "team+share", (f.team,)
        yield "share", ()
    yield "team+gpus", (f.team, gpu_class(f.gpus))
    yield "team", (f.team,)
    yield "all", ()


#: Kinds of key whose history is the share of the time limit a job used (runtime / limit, at most 1): a
#: limit no ended job had yet is answered from how much of their limits like jobs used.
_SHARE_KINDS = frozenset({"team+gpus+share", "team+share", "share"})


def quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of a sorted, non-empty list (deterministic, no interpolation)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class RuntimeEstimator:
    """Per-key recent runtimes of ended jobs; quantiles from the most specific key with enough of them."""

    def __init__(self, window: int = 32, min_samples: int = 2) -> None:
        if window < 1 or not 1 <= min_samples <= window:
            raise ValueError("need window >= 1 and 1 <= min_samples <= window")
        self.window = window
        self.min_samples = min_samples
        self.clock = -math.inf
        self._history: dict[tuple[str, tuple[object, ...]], deque[float]] = {}

    def observe(self, ended_at: float, features: JobFeatures, runtime_s: float) -> None:
        """A job ended at ``ended_at`` after running ``runtime_s`` seconds."""
        if ended_at < self.clock:
            raise ValueError(f"an end at {ended_at} is older than the estimator's clock {self.clock}")
        if not runtime_s > 0:
            raise ValueError("runtime_s must be > 0")
        self.clock = ended_at
        limit = features.time_limit_s
        for key in _keys(features):
            runs = self._history.get(key)
            if runs is None:
                runs = self._history[key] = deque(maxlen=self.window)
            runs.append(min(1.0, runtime_s / limit) if key[0] in _SHARE_KINDS and limit else runtime_s)

    def estimate(
        self, features: JobFeatures, now: float, elapsed_s: float = 0.0, *, advance: bool = True
    ) -> RuntimeEstimate:
        """Quantiles of the runtime of a job with ``features``, known at ``now``, that has run
        ``elapsed_s`` seconds so far. ``advance=False``: a question that leaves the clock where it is (a
        dry run's, beside a refresh that still asks about an earlier moment)."""
        if now < self.clock:
            raise ValueError(f"asked for {now}, but the estimator already saw an end at {self.clock}")
        if advance:
            self.clock = now
        limit = features.time_limit_s
        remembered = False
        for key in _keys(features):
            runs = self._history.get(key)
            if runs is None:
                continue
            remembered = True
            scale = limit if key[0] in _SHARE_KINDS and limit else 1.0
            longer = sorted(
                r * scale for r in tuple(runs) if r * scale > elapsed_s
            )  # a copy: ``observe`` may append
            if len(longer) >= self.min_samples:
                return self._capped(
                    quantile(longer, 0.5), quantile(longer, 0.9), limit, elapsed_s, key[0], len(longer)
                )
        # Past every runtime remembered: half as long again. With nothing remembered at all, what a job of
        # no history is expected to run at its submit (its limit, else an hour), or longer if it already has:
        # a job that just started would otherwise be expected to end within seconds.
        grown = elapsed_s * (1.0 + _TAIL_GROWTH)
        guess = grown if remembered else max(grown, limit or _NO_HISTORY_S)
        return self._capped(guess, guess, limit, elapsed_s, "none", 0)

    @staticmethod
    def _capped(
        p50: float, p90: float, limit: float | None, elapsed_s: float, key: str, samples: int
    ) -> RuntimeEstimate:
        """The time limit caps both (unless the job already ran past it: then it ends about now)."""
        if limit is not None and limit > elapsed_s:
            p50, p90 = min(p50, limit), min(p90, limit)
        return RuntimeEstimate(p50=p50, p90=max(p50, p90), key=key, samples=samples)
