"""The recent past the health monitor keeps for detection: signal samples and rank step times. No I/O.

Keeping every heartbeat of every node for the longest window (10 min) would cost 12,500 nodes x 600
samples x 8 GPUs of memory, and judging them all every second a core. Almost every node is clean almost
all the time, and a clean sample teaches detection nothing but "still clean", so:

- a node is **watched** from its first *notable* sample (a GPU throttled or hot, a counter that grew, a
  hard fault, a port down, slower than it has been, or erroring) until its verdict is healthy again and
  no notable sample is left in the longest window; only watched nodes' samples are kept and judged;
- a watched node's samples are thinned to one per ``keep_every_s`` (uniformly in time, so shares over a
  window keep their meaning), except samples that carry a hard fault or a port's state change (a flap
  between two kept samples must not vanish); counters lose nothing by thinning, they are judged by their
  increase;
- an unwatched node keeps one sample, its latest: the baseline a counter's growth is measured from.

A node starts being judged on the samples since it became watched, so a rule that needs its window
covered (sustained throttling) fires up to ``min_cover`` x its window after the first notable sample.

Step times are kept per rank, one report per ``step_every_s`` (reports are deduplicated: the agent
repeats a rank's latest report in each heartbeat), at most the straggler window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from .detection import DetectionPolicy, GpuSignals, NicSignals, NodeSample
from .liveness import FATAL_XIDS
from .stragglers import RankStep

__all__ = ["SignalWindows", "StepWindows", "longest_window_s"]


def longest_window_s(policy: DetectionPolicy) -> float:
    return max(
        policy.throttle_degraded_window_s,
        policy.ecc_window_s,
        policy.nvlink_window_s,
        policy.nic_window_s,
        policy.nic_slow_window_s,
        policy.hard_window_s,
    )


def _gpu_notable(g: GpuSignals, before: GpuSignals | None, policy: DetectionPolicy) -> bool:
    if g.temperature_c > policy.hot_temperature_c or g.ecc_uncorrectable > 0 or g.xid in FATAL_XIDS:
        return True
    if g.throttle_thermal or g.throttle_power_brake or g.throttle_hw_slowdown:
        return True
    if before is None:
        return g.ecc_corrected > 0 or g.nvlink_errors > 0
    return g.ecc_corrected != before.ecc_corrected or g.nvlink_errors != before.nvlink_errors


def _nic_notable(n: NicSignals, before: NicSignals | None) -> bool:
    if not n.link_up or (n.expected_speed_gbps is not None and n.speed_gbps < n.expected_speed_gbps):
        return True
    if before is None:
        return False
    return n.errors != before.errors or n.link_up != before.link_up or n.link_downed != before.link_downed


def _notable(sample: NodeSample, before: NodeSample | None, policy: DetectionPolicy) -> bool:
    gpus = {g.index: g for g in before.gpus} if before is not None else {}
    nics = {n.name: n for n in before.nics} if before is not None else {}
    return any(_gpu_notable(g, gpus.get(g.index), policy) for g in sample.gpus) or any(
        _nic_notable(n, nics.get(n.name)) for n in sample.nics
    )


def _must_keep(sample: NodeSample, kept: NodeSample) -> bool:
    """A hard fault, or a port whose link state differs from the last kept sample's."""
    if any(g.ecc_uncorrectable > 0 or g.xid in FATAL_XIDS for g in sample.gpus):
        return True
    links = {n.name: n.link_up for n in kept.nics}
    return any(links.get(n.name, n.link_up) != n.link_up for n in sample.nics)


class _Watched:
    __slots__ = ("last_notable", "samples")

    def __init__(self, baseline: NodeSample | None, sample: NodeSample) -> None:
        self.samples: deque[NodeSample] = deque([baseline, sample] if baseline is not None else [sample])
        self.last_notable = sample.at


class SignalWindows:
    """Samples per node, kept as the module docstring says."""

    def __init__(self, policy: DetectionPolicy, keep_every_s: float = 2.0) -> None:
        self.policy = policy
        self.keep_every_s = keep_every_s
        self.window_s = longest_window_s(policy)
        self._latest: dict[str, NodeSample] = {}
        self._watched: dict[str, _Watched] = {}
        self._pinned: set[str] = set()

    def add(self, sample: NodeSample) -> None:
        before = self._latest.get(sample.node_id)
        if before is not None and sample.at <= before.at:
            return  # a repeated or late heartbeat
        self._latest[sample.node_id] = sample
        notable = _notable(sample, before, self.policy)
        watched = self._watched.get(sample.node_id)
        if watched is None:
            if notable or sample.node_id in self._pinned:
                self._watched[sample.node_id] = _Watched(before, sample)
            return
        if notable:
            watched.last_notable = sample.at
        kept = watched.samples[-1]
        if sample.at - kept.at >= self.keep_every_s or _must_keep(sample, kept):
            watched.samples.append(sample)

    def watch(self, node_id: str) -> None:
        """Keep this node's samples from now whatever they say (its verdict is not healthy: a probation
        needs clean samples to end), until ``expire`` is told it is healthy."""
        self._pinned.add(node_id)
        latest = self._latest.get(node_id)
        if node_id not in self._watched and latest is not None:
            self._watched[node_id] = _Watched(None, latest)
            self._watched[node_id].last_notable = float("-inf")

    def rebase(self, sample: NodeSample) -> None:
        """Take ``sample`` as the node's latest without judging it: the baseline of a node whose clean
        samples the caller did not pass (it kept the raw beat instead)."""
        if sample.node_id not in self._watched:
            self._latest[sample.node_id] = sample

    def wants(self, node_id: str) -> bool:
        """Whether every sample of this node is kept (watched, or pinned by a verdict)."""
        return node_id in self._watched or node_id in self._pinned

    def watched(self) -> Iterator[str]:
        return iter(self._watched)

    def samples(self, node_id: str) -> list[NodeSample]:
        watched = self._watched.get(node_id)
        return list(watched.samples) if watched is not None else []

    def expire(self, now: float, healthy: Iterable[str]) -> None:
        """Drop samples older than the longest window; stop watching the ``healthy`` nodes (verdict
        healthy, probation done) that have had nothing notable within it."""
        horizon = now - self.window_s
        for kept in self._watched.values():
            while len(kept.samples) > 1 and kept.samples[0].at < horizon:
                kept.samples.popleft()
        for node_id in healthy:
            self._pinned.discard(node_id)
            watched = self._watched.get(node_id)
            if watched is not None and watched.last_notable < horizon:
                del self._watched[node_id]

    def forget(self, node_id: str) -> None:
        self._latest.pop(node_id, None)
        self._watched.pop(node_id, None)
        self._pinned.discard(node_id)


class StepWindows:
    """Each rank's step-time reports over the straggler window, one per ``step_every_s``."""

    def __init__(self, window_s: float, step_every_s: float) -> None:
        self.window_s = window_s
        self.step_every_s = step_every_s
        # job -> (node, rank) -> reports, oldest first
        self._jobs: dict[str, dict[tuple[str, int], deque[RankStep]]] = {}

    def add(self, steps: Iterable[RankStep]) -> None:
        for step in steps:
            ranks = self._jobs.setdefault(step.job_id, {})
            reports = ranks.setdefault((step.node_id, step.rank), deque())
            if not reports or step.at - reports[-1].at >= self.step_every_s:
                reports.append(step)

    def jobs(self) -> list[str]:
        return sorted(self._jobs)

    def of_job(self, job_id: str) -> list[RankStep]:
        return [r for reports in self._jobs.get(job_id, {}).values() for r in reports]

    def expire(self, now: float) -> None:
        horizon = now - self.window_s
        for job_id in list(self._jobs):
            ranks = self._jobs[job_id]
            for key in list(ranks):
                reports = ranks[key]
                while reports and reports[0].at < horizon:
                    reports.popleft()
                if not reports:
                    del ranks[key]
            if not ranks:
                del self._jobs[job_id]
