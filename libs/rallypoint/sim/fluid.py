"""The fluid reference: what avg JCT an idealized scheduler reaches on a workload, with and without the
guaranteed share.

The idealized scheduler knows every job's runtime, preempts and resumes for free (no work lost, no
checkpoint overhead), and never meets fragmentation: the cluster is one pool of ``gpus`` GPUs, so a gang
only needs as many free GPUs as it has, wherever they are. At every arrival and completion it re-ranks all
unfinished jobs by least remaining GPU-seconds (the near-optimal rule for mean completion time on one
machine, SRPT, extended to gangs by their width) and runs them greedily in that order, skipping a gang that
does not fit.

With ``nominal`` it also keeps each team's guaranteed share the way ``metrics.Recorder`` measures it:
first, in rank order, each team's jobs are admitted while the team stays within its nominal; only then
does the rest of the pool go to every remaining job in rank order. After the first pass a team either
has nothing waiting or holds enough that its smallest waiting job would take it above its nominal, which
is the "honoured" condition, at every instant (when the nominals add up to at most ``gpus``, as the
converters' quota splits do).

It is a reference point, not a proven lower bound: greedy ranking is not optimal for gangs on many GPUs.
It answers a narrower question that `make eval` asks of each row: could a policy that keeps the
guarantee reach a target avg JCT even with perfect knowledge and free preemption? Faults, GPU types and
elasticity are ignored (every job runs ``duration`` on ``gpus`` GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .workload import Job

__all__ = ["FluidResult", "fluid_reference"]

# remaining seconds below this count as finished (float subtraction leaves crumbs)
_EPS = 1e-6


@dataclass(frozen=True)
class FluidResult:
    avg_jct: float
    #: job id -> completion time minus submit
    jct: Mapping[str, float]


def fluid_reference(jobs: Sequence[Job], gpus: int, nominal: Mapping[str, int] | None = None) -> FluidResult:
    """Run the idealized schedule of ``jobs`` on a pool of ``gpus`` GPUs (see the module docstring).

    ``nominal``: team -> guaranteed GPUs; None schedules without any guarantee.
    """
    if gpus <= 0:
        raise ValueError("gpus must be positive")
    too_big = [j.id for j in jobs if j.gpus > gpus]
    if too_big:
        raise ValueError(
            f"{len(too_big)} job(s) need more than {gpus} GPUs and would never run: {too_big[:3]}"
        )
    order = sorted(range(len(jobs)), key=lambda k: jobs[k].submit)  # stable: file order breaks ties
    width = [jobs[k].gpus for k in order]
    team = [jobs[k].team for k in order]
    submit = [jobs[k].submit for k in order]
    left = [max(0.0, jobs[k].duration) for k in order]
    noms = dict(nominal or {})
    n = len(order)
    end = [0.0] * n
    active: list[int] = []
    nxt = 0
    t = 0.0
    while nxt < n or active:
        if not active:
            t = max(t, submit[nxt])
        while nxt < n and submit[nxt] <= t:
            active.append(nxt)
            nxt += 1
        # least remaining GPU-seconds first; arrival order breaks ties
        active.sort(key=lambda k: (left[k] * width[k], k))
        chosen = _admit(active, width, team, noms, gpus)
        # land exactly on the next arrival (t + (s - t) can round below s and spin an extra step)
        t_next = t + min((left[k] for k in chosen), default=math.inf)
        if nxt < n:
            t_next = min(t_next, submit[nxt])
        step = t_next - t
        t = t_next
        still: list[int] = []
        for k in active:
            if k in chosen:
                left[k] -= step
                if left[k] <= _EPS:
                    end[k] = t
                    continue
            still.append(k)
        active = still
    spans = [end[i] - submit[i] for i in range(n)]
    jct = {jobs[order[i]].id: spans[i] for i in range(n)}
    return FluidResult(avg_jct=sum(spans) / n if n else 0.0, jct=jct)


def _admit(
    active: Sequence[int], width: Sequence[int], team: Sequence[str], noms: Mapping[str, int], gpus: int
) -> set[int]:
    """The jobs that run until the next event: guaranteed shares first (when ``noms``), then greedy."""
    chosen: set[int] = set()
    used = 0
    if noms:
        held: dict[str, int] = {}
        for k in active:
            a = held.get(team[k], 0)
            if a + width[k] <= noms.get(team[k], 0) and used + width[k] <= gpus:
                held[team[k]] = a + width[k]
                used += width[k]
                chosen.add(k)
    for k in active:
        if used >= gpus:
            break
        if k not in chosen and used + width[k] <= gpus:
            used += width[k]
            chosen.add(k)
    return chosen
