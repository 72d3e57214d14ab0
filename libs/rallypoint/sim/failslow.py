"""Fail-slow episodes (a node runs slow for a while) and the straggler-replacement policy, for the simulator.

An episode is ``(node, start, duration, factor)``: while it lasts every rank on the node computes ``factor``
times slower. Training gangs are synchronous (every step ends in a collective), so a gang advances at the pace
of its slowest rank: the engine divides a gang's progress rate by the largest factor among its nodes.

Where the numbers come from (see docs/simulator.md, "Fail-slow nodes", for the full discussion):

- **duration**: Falcon (Wu et al., ATC'25, a production cluster of > 10k GPUs) reports fail-slow episodes
  lasting "from tens of seconds to nearly ten hours". The shape inside that range is not published; we draw
  it log-uniform on [30 s, 10 h] (median ~17 min, mean ~1.4 h), which puts equal weight on each decade.
- **factor**: Falcon reports that fail-slows collectively delay the average job by 1.34x. No per-episode
  distribution is published; we draw ``1 + Exp(mean 0.34)`` (capped at 10x), so the mean episode slows a
  gang by Falcon's 1.34x and most episodes are mild (72 % stay below the live detector's 1/0.7 threshold).
- **rate**: no per-node-day frequency is published in the sources we found (Falcon, C4, ByteDance's OSDI'25
  straggler study give durations, slowdowns and downtime shares, not rates). We assume a node spends on
  average ``mean_gap_s`` (default 4 days) healthy between episodes, exponential. :func:`gang_slowdown`
  shows what that implies: a 128-node (1,024-GPU) gang then runs ~1.3x slower on average, the order
  Falcon measured.

Per node, episodes come from their own ``random.Random`` seeded by ``(seed, node id)``: the same seed gives
the same episodes whatever else the simulation draws (node failures keep their own generator).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import msgspec

from rallypoint.health.stragglers import RankStep, StragglerPolicy, find_stragglers

__all__ = [
    "Episode",
    "EpisodeModel",
    "FailSlow",
    "gang_slowdown",
    "node_episodes",
    "stragglers_in_gang",
]


class Episode(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One fail-slow episode: ``node`` runs ``factor`` times slower during [start, start + duration)."""

    node: str
    start: float
    duration: float
    factor: float

    @property
    def end(self) -> float:
        return self.start + self.duration


class EpisodeModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The seeded generator's distributions (defaults and their sources in the module docstring)."""

    #: mean healthy time of one node between two episodes (exponential); assumption, no published rate
    mean_gap_s: float = 4 * 86400.0
    #: Falcon (ATC'25): "tens of seconds to nearly ten hours"; log-uniform in between (shape assumed)
    min_duration_s: float = 30.0
    max_duration_s: float = 36000.0
    #: factor = 1 + Exp(mean_extra): the mean episode is Falcon's average 1.34x (per-episode use assumed)
    mean_extra: float = 0.34
    max_factor: float = 10.0

    def mean_duration_s(self) -> float:
        lo, hi = self.min_duration_s, self.max_duration_s
        return (hi - lo) / math.log(hi / lo) if hi > lo else lo


class FailSlow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fail-slow episodes for one simulation and what the cluster does about them.

    ``episodes`` given: exactly those (scripted what-ifs, tests); otherwise ``model`` generates them per node
    from ``seed``. ``replace`` turns on straggler replacement: ``detect_after_s`` after a gang starts running
    slowed (the live detector's window, ``StragglerPolicy.window_s``, 300 s), the detector's rule is applied
    to the gang's ranks (one per GPU) with the node slowdowns as step times; every node it flags is cordoned
    (no new placements until its episode ends plus ``probation_s``) and the gang is restarted from its last
    checkpoint, paying ``restart_overhead_s`` (default: the cluster's ``faults.checkpoint_overhead``), like a
    gang whose node failed. The core places it again, away from the cordoned node.

    ``detector="peers"`` is the live rule (relative to the gang's own ranks: a gang on one node has no
    healthy peer and is never flagged); ``"node"`` flags any node whose factor is above the rule's k, as a
    node-level check (a benchmark on the node itself) would.
    """

    episodes: tuple[Episode, ...] | None = None
    model: EpisodeModel = EpisodeModel()
    seed: int = 0
    replace: bool = False
    detector: str = "peers"
    detect_after_s: float = StragglerPolicy().window_s
    probation_s: float = 3600.0
    #: restore overhead of a replacement restart; None: the cluster's ``faults.checkpoint_overhead``
    restart_overhead_s: float | None = None
    policy: StragglerPolicy = StragglerPolicy()

    def __post_init__(self) -> None:
        if self.detector not in ("peers", "node"):
            raise ValueError(f"fail-slow detector must be 'peers' or 'node', not {self.detector!r}")
        if self.detect_after_s < 0 or self.probation_s < 0 or (self.restart_overhead_s or 0.0) < 0:
            raise ValueError("fail-slow detect_after_s, probation_s and restart_overhead_s must be >= 0")


def _draw(rng: random.Random, node: str, start: float, model: EpisodeModel) -> Episode:
    lo, hi = math.log(model.min_duration_s), math.log(model.max_duration_s)
    duration = math.exp(rng.uniform(lo, hi))
    factor = min(model.max_factor, 1.0 + rng.expovariate(1.0 / model.mean_extra))
    return Episode(node=node, start=start, duration=duration, factor=factor)


def node_episodes(node: str, seed: int, model: EpisodeModel) -> Iterator[Episode]:
    """The endless, seeded sequence of one node's episodes, in start order, never overlapping."""
    rng = random.Random(f"failslow:{seed}:{node}")  # str seeds hash with SHA-512: stable across runs
    t = 0.0
    while True:
        ep = _draw(rng, node, t + rng.expovariate(1.0 / model.mean_gap_s), model)
        yield ep
        t = ep.end


def gang_slowdown(nodes: int, model: EpisodeModel, horizon_s: float = 365 * 86400.0, seed: int = 0) -> float:
    """Long-run average slowdown of a gang spread over ``nodes`` nodes under ``model`` (how much longer it
    takes than without episodes): a check of the rate against published job-level figures."""
    # time-weighted average of the max factor over the nodes: sweep every episode boundary in the horizon
    edges: list[tuple[float, int, float]] = []
    for i in range(nodes):
        for ep in node_episodes(f"n{i}", seed, model):
            if ep.start >= horizon_s:
                break
            edges.append((ep.start, 1, ep.factor))
            edges.append((min(ep.end, horizon_s), -1, ep.factor))
    edges.sort()
    active: dict[float, int] = {}  # factor -> episodes with it now under way
    progress = 0.0  # integral of 1 / (largest factor) over time: the work the gang gets done
    last = 0.0
    for t, kind, factor in edges:
        progress += (t - last) / max(active, default=1.0)
        last = t
        active[factor] = active.get(factor, 0) + kind
        if not active[factor]:
            del active[factor]
    progress += horizon_s - last
    return horizon_s / progress if progress > 0 else math.inf


def stragglers_in_gang(
    placements: Sequence[tuple[str, int]], factor: dict[str, float], cfg: FailSlow, now: float
) -> list[str]:
    """Nodes of a gang that the detection rule flags. ``placements``: (node, GPUs of the gang on it)."""
    slow = sorted({n for n, _ in placements if factor.get(n, 1.0) > 1.0})
    if cfg.detector == "node":
        return [n for n in slow if factor[n] > cfg.policy.k]
    # The live rule on synthetic reports: one rank per GPU, step time = its node's factor, three reports
    # spanning the window (the minimum the detector accepts), so the verdict is the detector's own.
    w = cfg.policy.window_s
    times = (now - w, now - w / 2, now)
    steps: list[RankStep] = []
    rank = 0
    for node, gpus in placements:
        f = factor.get(node, 1.0)
        for _ in range(gpus):
            steps.extend(RankStep(job_id="g", node_id=node, rank=rank, at=t, step_time_s=f) for t in times)
            rank += 1
    return sorted({s.node_id for s in find_stragglers(steps, now, cfg.policy)})
