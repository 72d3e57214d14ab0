"""The health monitor's signal judge: heartbeats in, ``NodeHealthChanged`` decisions out. No I/O, no clock.

Glue between the windows the monitor keeps (``windows``) and the pure detection (``detection.detect``):

- every heartbeat is turned into a ``NodeSample`` and its ranks' step times (``samples``); a port's
  expected speed is the fastest this monitor has seen it negotiate (a link that trains down from 400 to
  200 Gb/s is judged against 400), unless configured;
- each ``judge`` call runs ``detect`` on the nodes worth judging only: watched ones (a notable sample in
  the window), those whose verdict is not healthy, and those under a gang a straggler scan flagged;
- the straggler scan (every ``scan_every_s``) looks at every gang's step times; a gang it flags stays a
  suspect for a straggler window after, so the verdict sees the same evidence until the straggle ends;
- the verdict a node starts from is the log's (``NodeView.health``): after a restart, after an operator's
  undrain, or when an append of ours did not make it, the fold is the truth and detection goes on from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rallypoint.events import HealthEvidence, NodeHealthChanged
from rallypoint.protocol import Heartbeat
from rallypoint.state import NodeView

from .detection import FAILED, HEALTHY, DetectionPolicy, Evidence, NodeHealth, Transition, detect
from .liveness import Decision
from .samples import node_sample, rank_steps
from .stragglers import RankStep, find_stragglers
from .windows import SignalWindows, StepWindows

__all__ = ["HealthJudge", "health_event"]


def _evidence(e: Evidence) -> HealthEvidence:
    return HealthEvidence(
        signal=e.signal,
        subject=e.subject,
        severity=e.severity,
        value=round(e.value, 6),
        threshold=round(e.threshold, 6),
        window_s=e.window_s,
        hard=e.hard,
    )


def _from_log(node: NodeView) -> NodeHealth:
    """The verdict the log holds for ``node``; probation restarts (the log does not say since when the
    node has been clean), which errs on keeping a node out a little longer."""
    evidence = tuple(
        Evidence(
            signal=e.signal,
            subject=e.subject,
            severity=e.severity,
            value=e.value,
            threshold=e.threshold,
            window_s=e.window_s,
            hard=e.hard,
        )
        for e in node.health_evidence
    )
    return NodeHealth(
        node_id=node.node_id,
        state=node.health,
        since=node.health_since,
        hard=node.health == FAILED,
        evidence=evidence,
        degraded_at=node.degraded_at,
    )


def health_event(t: Transition) -> NodeHealthChanged:
    return NodeHealthChanged(
        node_id=t.node_id,
        state=t.to_state,  # type: ignore[arg-type]
        previous=t.from_state,  # type: ignore[arg-type]
        evidence=tuple(_evidence(e) for e in t.evidence),
        at=t.at,
    )


def _same_gpu_counters(beat: Heartbeat, before: Heartbeat) -> bool:
    """Whether two beats report the same GPUs, in order, with the same cumulative counters."""
    if len(beat.gpus) != len(before.gpus):
        return False
    for g, b in zip(beat.gpus, before.gpus, strict=True):
        if g.index != b.index or g.ecc_corrected != b.ecc_corrected or g.nvlink_errors != b.nvlink_errors:
            return False
    return True


def _same_nic_counters(beat: Heartbeat, before: Heartbeat) -> bool:
    """Whether two beats report the same ports, in order, with the same cumulative counters."""
    if not beat.nics:
        return not before.nics  # the scale harness's nodes and old agents report none
    if len(beat.nics) != len(before.nics):
        return False
    for n, m in zip(beat.nics, before.nics, strict=True):
        if n.name != m.name or n.errors != m.errors or n.link_downed != m.link_downed:
            return False
    return True


def _shortest_window_s(policy: DetectionPolicy) -> float:
    return min(
        policy.throttle_suspect_window_s,
        policy.nic_slow_window_s,
        policy.ecc_window_s,
        policy.nvlink_window_s,
        policy.nic_window_s,
    )


class HealthJudge:
    def __init__(
        self,
        policy: DetectionPolicy,
        *,
        keep_every_s: float = 2.0,
        scan_every_s: float = 10.0,
        nic_speed_gbps: Mapping[str, float] | None = None,
    ) -> None:
        self.policy = policy
        # at least ten samples in the shortest window, so its share and cover rules mean something
        self.signals = SignalWindows(policy, keep_every_s=min(keep_every_s, _shortest_window_s(policy) / 10))
        straggler_window = policy.stragglers.window_s
        # enough reports for a median over the window, few enough to hold 100k ranks
        self.steps = StepWindows(straggler_window, step_every_s=max(1.0, straggler_window / 30))
        self.scan_every_s = min(scan_every_s, straggler_window / 3)
        self.configured_nic_speed = dict(nic_speed_gbps or {})
        self._nic_speed: dict[tuple[str, str], float] = {}
        self._verdicts: dict[str, NodeHealth] = {}
        self._baseline: dict[str, Heartbeat] = {}  # unwatched nodes: their latest beat, raw
        self._suspect_jobs: dict[str, float] = {}  # job -> until when its steps are judged
        self._next_scan = float("-inf")

    # -- input --------------------------------------------------------------------------------------

    def heard(self, beat: Heartbeat) -> None:
        steps = rank_steps(beat) if beat.ranks else ()
        if steps:
            self.steps.add(steps)
        expected = self._expected_speeds(beat)
        node_id = beat.node_id
        if not self.signals.wants(node_id) and self._quiet(beat, expected):
            # the common case, 2,500 times a second at scale: a clean beat that changes no counter is
            # kept raw, as the baseline, and turned into a sample only if the node becomes watched
            self._baseline[node_id] = beat
            return
        baseline = self._baseline.pop(node_id, None)
        if baseline is not None:
            self.signals.rebase(node_sample(baseline, expected))
        self.signals.add(node_sample(beat, expected))

    def _quiet(self, beat: Heartbeat, expected: Mapping[str, float]) -> bool:
        """Nothing in ``beat`` a sample would be notable for, against the raw baseline kept.

        Run for every heartbeat, so: GPU samples equal to the baseline's are quiet as it was (only quiet
        beats become the baseline, and equal samples carry equal counters; an idle GPU reports the same
        sample beat after beat); otherwise one pass over the GPUs and the counters compared pairwise
        with the baseline's, what comparing ``_counters`` of both says without building them."""
        for n in beat.nics:
            if not n.link_up or n.speed_gbps < expected.get(n.name, 0.0):
                return False
        before = self._baseline.get(beat.node_id)
        if before is not None and beat.gpus == before.gpus:
            return _same_nic_counters(beat, before)
        if not self._gpus_clean(beat):
            return False
        if before is None:
            return not any(g.ecc_corrected or g.nvlink_errors for g in beat.gpus)
        return _same_gpu_counters(beat, before) and _same_nic_counters(beat, before)

    def _gpus_clean(self, beat: Heartbeat) -> bool:
        """No GPU throttled, hot or with a hard fault."""
        hot = self.policy.hot_temperature_c
        for g in beat.gpus:
            if (
                g.throttled
                or g.throttle_thermal
                or g.throttle_power_brake
                or g.throttle_hw_slowdown
                or g.temperature_c > hot
                or g.ecc_uncorrectable
                or g.xid
            ):
                return False
        return True

    def _expected_speeds(self, beat: Heartbeat) -> dict[str, float]:
        expected: dict[str, float] = {}
        for nic in beat.nics:
            key = (beat.node_id, nic.name)
            if nic.link_up and nic.speed_gbps > self._nic_speed.get(key, 0.0):
                self._nic_speed[key] = nic.speed_gbps
            best = self.configured_nic_speed.get(nic.name, self._nic_speed.get(key))
            if best:
                expected[nic.name] = best
        return expected

    # -- judging ------------------------------------------------------------------------------------

    def judge(self, nodes: Mapping[str, NodeView], now: float) -> list[Decision]:
        """The health changes to append now; ``nodes``: the fold's node views."""
        self._follow_log(nodes)
        if now >= self._next_scan:
            self._scan(now)
            self._next_scan = now + self.scan_every_s
        suspects = sorted(job for job, until in self._suspect_jobs.items() if until >= now)
        steps = [s for job in suspects for s in self.steps.of_job(job)]
        judged = self._judged(nodes, steps)
        previous = {n: self._verdicts.get(n) or NodeHealth(node_id=n, since=now) for n in judged}
        samples = [s for n in judged for s in self.signals.samples(n)]
        verdict = detect(previous, samples, steps, now, self.policy)
        for health in verdict.nodes:
            self._verdicts[health.node_id] = health
        self._tidy(now)
        return [
            Decision(
                node_id=t.node_id,
                event=health_event(t),
                msg_id=f"{t.node_id}:NodeHealthChanged:{t.to_state}:{t.at:.3f}",
            )
            for t in verdict.transitions
            if t.node_id in nodes
        ]

    def _follow_log(self, nodes: Mapping[str, NodeView]) -> None:
        for node_id, node in nodes.items():
            mine = self._verdicts.get(node_id)
            if node.health != (mine.state if mine is not None else HEALTHY):
                self._verdicts[node_id] = _from_log(node)
            if node.health not in (HEALTHY, FAILED):
                self.signals.watch(node_id)
        for node_id in [n for n in self._verdicts if n not in nodes]:
            del self._verdicts[node_id]

    def _scan(self, now: float) -> None:
        self.steps.expire(now)
        window = self.policy.stragglers.window_s
        for job in self.steps.jobs():
            if find_stragglers(self.steps.of_job(job), now, self.policy.stragglers):
                self._suspect_jobs[job] = now + window
        for job in [j for j, until in self._suspect_jobs.items() if until < now]:
            del self._suspect_jobs[job]

    def _judged(self, nodes: Mapping[str, NodeView], steps: Iterable[RankStep]) -> set[str]:
        judged = set(self.signals.watched())
        judged.update(n for n, v in self._verdicts.items() if v.state != HEALTHY)
        judged.update(s.node_id for s in steps)
        # a node the log does not know (not registered yet) or has lost is not ours to judge, and a failed
        # one waits for an operator whatever its samples say (``detect`` would keep it failed anyway)
        return {n for n in judged if n in nodes and nodes[n].status != "lost" and self._state_of(n) != FAILED}

    def _state_of(self, node_id: str) -> str:
        verdict = self._verdicts.get(node_id)
        return verdict.state if verdict is not None else HEALTHY

    def _tidy(self, now: float) -> None:
        healthy = [n for n, v in self._verdicts.items() if v.state == HEALTHY and v.clean_since is not None]
        self.signals.expire(now, healthy)
        watched = set(self.signals.watched())
        for node_id in healthy:
            # a healthy node with no recent degradation is the default verdict: nothing to remember
            recent = any(now - t <= self.policy.repeat_window_s for t in self._verdicts[node_id].degraded_at)
            if not recent and node_id not in watched:
                del self._verdicts[node_id]

    def verdict(self, node_id: str) -> NodeHealth | None:
        return self._verdicts.get(node_id)
