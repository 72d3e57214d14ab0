"""Node health detection: windows of samples in, each node's health state and its evidence out. Pure.

The shape of ``control/reconcile.py``: the caller passes the previous verdict per node (later: folded from
the log), the samples it holds for the recent past and ``now``; nothing here keeps a clock, a file or a
socket. The health monitor calls it through ``judge.HealthJudge``.

States, worst last: ``healthy`` -> ``suspect`` (watch, act on nothing) -> ``degraded`` (a soft fault: cordon,
replace) -> ``failed`` (a hard fault: drain, wait for an operator).

Hysteresis, so a blip never drains a node:
- every "sustained" rule needs a share of the samples over a window that they cover, never one sample;
- counters (corrected ECC, NVLink, NIC errors) are judged by their increase over a window (a rate);
- a soft state is left only after a clean probation window (``suspect_clear_s``, ``probation_s``); a new
  finding in probation restarts it; ``failed`` is never left here (an operator clears it);
- a node degraded ``repeat_limit`` times within ``repeat_window_s`` is failed: a flapping node costs every
  gang placed on it a restart, however short each episode.

Thresholds are in ``DetectionPolicy`` with the reason for each default; docs/health.md lists them.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from .liveness import FATAL_XIDS
from .stragglers import RankStep, Straggler, StragglerPolicy, find_stragglers

__all__ = [
    "DEFAULT_POLICY",
    "DEGRADED",
    "FAILED",
    "HEALTHY",
    "SUSPECT",
    "DetectionPolicy",
    "Evidence",
    "GpuSignals",
    "NicSignals",
    "NodeHealth",
    "NodeSample",
    "Transition",
    "Verdict",
    "detect",
]

HEALTHY, SUSPECT, DEGRADED, FAILED = "healthy", "suspect", "degraded", "failed"
_RANK = {HEALTHY: 0, SUSPECT: 1, DEGRADED: 2, FAILED: 3}


class GpuSignals(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU at one instant (NVML). Counters are cumulative since driver load (volatile)."""

    index: int
    temperature_c: float = 0.0
    #: Clock-throttle reasons. Software power capping at TDP is normal under load and is not a signal;
    #: these are: SW/HW thermal slowdown, HW power brake, HW slowdown.
    throttle_thermal: bool = False
    throttle_power_brake: bool = False
    throttle_hw_slowdown: bool = False
    ecc_corrected: int = 0
    ecc_uncorrectable: int = 0
    #: The last XID seen (0: none).
    xid: int = 0
    #: CRC + replay + recovery errors summed over the GPU's links.
    nvlink_errors: int = 0


class NicSignals(msgspec.Struct, frozen=True, kw_only=True):
    """One NIC / InfiniBand port at one instant (sysfs). ``errors``: cumulative symbol + receive errors."""

    name: str
    link_up: bool = True
    speed_gbps: float = 0.0
    #: What the port should negotiate (from inventory); None: speed is not judged.
    expected_speed_gbps: float | None = None
    errors: int = 0
    #: Cumulative times the link went down (IB ``link_downed``, Ethernet carrier changes / 2): a flap
    #: between two samples shows here even when no sample caught the port down.
    link_downed: int = 0


class NodeSample(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    at: float
    gpus: tuple[GpuSignals, ...] = ()
    nics: tuple[NicSignals, ...] = ()


class DetectionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Defaults for 1 s heartbeats; every window is in seconds of sample time (``at``), never of calls."""

    #: Above this a GPU sample counts as hot (the monitor's drain threshold today, now sustained-only).
    hot_temperature_c: float = 90.0
    #: A GPU throttled (or hot) in at least this share of the window's samples is "throttled" for it.
    throttle_share: float = 0.5
    #: Throttled for a minute: suspect. Long enough that a checkpoint write's power spike does not count.
    throttle_suspect_window_s: float = 60.0
    #: Throttled for five minutes: degraded. Falcon (ATC'25) fail-slow episodes last tens of seconds to
    #: ~10 h; past five minutes one costs more than a node replacement's checkpoint-restart.
    throttle_degraded_window_s: float = 300.0
    #: Uncorrectable ECC / fatal XID in any sample this recent fails the node; call ``detect`` at least
    #: this often. Short, so a node an operator has cleared is judged on what its GPUs say now.
    hard_window_s: float = 30.0
    #: Share rules need samples that span this share of the window (a node just heard is not judged).
    min_cover: float = 0.8
    #: Corrected ECC per GPU over the window: a leading indicator of a failing HBM row (no published
    #: threshold; operators' rule of thumb is "a burst, not a trickle"). 10: suspect, 100: degraded.
    ecc_window_s: float = 600.0
    ecc_suspect: int = 10
    ecc_degraded: int = 100
    #: NVLink errors per GPU over the window; replays happen now and then, a storm does not.
    nvlink_window_s: float = 600.0
    nvlink_suspect: int = 10
    nvlink_degraded: int = 100
    #: NIC flaps (up -> down) over the window: one is suspect, ``nic_flaps_degraded`` degraded.
    nic_window_s: float = 600.0
    nic_flaps_degraded: int = 3
    #: A port down in consecutive samples spanning this long: degraded (a collective cannot run on it).
    nic_down_s: float = 10.0
    #: A port below its expected speed for this window (samples covering it): degraded.
    nic_slow_window_s: float = 60.0
    nic_errors_suspect: int = 100
    nic_errors_degraded: int = 1000
    #: Clean this long: suspect -> healthy.
    suspect_clear_s: float = 60.0
    #: Clean this long: degraded -> healthy (a probation as long as the longest window above, x 1.5).
    probation_s: float = 900.0
    #: Degraded this many times within the window: failed (hard).
    repeat_limit: int = 3
    repeat_window_s: float = 86_400.0
    stragglers: StragglerPolicy = msgspec.field(default_factory=StragglerPolicy)


DEFAULT_POLICY = DetectionPolicy()


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One finding: ``value`` against ``threshold`` over ``window_s`` (0: an instant), on ``subject``."""

    signal: str
    subject: str
    severity: str
    value: float
    threshold: float
    window_s: float = 0.0
    hard: bool = False


class NodeHealth(msgspec.Struct, frozen=True, kw_only=True):
    """A node's verdict; pass it back in as ``previous`` next time."""

    node_id: str
    state: str = HEALTHY
    since: float = 0.0
    #: failed by a hard fault: only an operator clears it.
    hard: bool = False
    #: What put the node in its state (kept through probation, so an event can carry it later).
    evidence: tuple[Evidence, ...] = ()
    #: Since when every verdict has been clean (None: the last one was not, or there was no data).
    clean_since: float | None = None
    #: When the node entered ``degraded``, within ``repeat_window_s``.
    degraded_at: tuple[float, ...] = ()


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """``kind``: ``soft`` (to suspect/degraded), ``hard`` (to failed) or ``recovered`` (back to healthy)."""

    node_id: str
    from_state: str
    to_state: str
    at: float
    kind: str
    evidence: tuple[Evidence, ...]


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeHealth, ...]
    transitions: tuple[Transition, ...]
    stragglers: tuple[Straggler, ...]


# --- window helpers --------------------------------------------------------------------------------------


def _within(samples: Sequence[NodeSample], now: float, window_s: float) -> list[NodeSample]:
    return [s for s in samples if now - window_s <= s.at <= now]


def _covers(samples: Sequence[NodeSample], window_s: float, policy: DetectionPolicy) -> bool:
    return len(samples) >= 2 and samples[-1].at - samples[0].at >= policy.min_cover * window_s


def _increase(values: Sequence[int]) -> int:
    """A counter's increase; a drop is a reset (driver reload), after which the new value is all new."""
    total = 0
    for before, after in itertools.pairwise(values):
        total += after - before if after >= before else after
    return total


def _gpu(sample: NodeSample, index: int) -> GpuSignals | None:
    return next((g for g in sample.gpus if g.index == index), None)


def _nic(sample: NodeSample, name: str) -> NicSignals | None:
    return next((n for n in sample.nics if n.name == name), None)


def _graded(
    signal: str, subject: str, value: float, suspect: float, degraded: float, window_s: float
) -> list[Evidence]:
    for severity, threshold in ((DEGRADED, degraded), (SUSPECT, suspect)):
        if value >= threshold:
            return [
                Evidence(
                    signal=signal,
                    subject=subject,
                    severity=severity,
                    value=value,
                    threshold=threshold,
                    window_s=window_s,
                )
            ]
    return []


# --- per-GPU rules ---------------------------------------------------------------------------------------


def _throttled(g: GpuSignals, policy: DetectionPolicy) -> bool:
    hot = g.temperature_c > policy.hot_temperature_c
    return hot or g.throttle_thermal or g.throttle_power_brake or g.throttle_hw_slowdown


def _throttle_share(samples: Sequence[NodeSample], index: int, policy: DetectionPolicy) -> float:
    seen = [g for s in samples if (g := _gpu(s, index)) is not None]
    return sum(_throttled(g, policy) for g in seen) / len(seen) if seen else 0.0


def _throttle_findings(
    samples: Sequence[NodeSample], index: int, now: float, p: DetectionPolicy
) -> list[Evidence]:
    # The degraded window first: five minutes throttled is also one minute throttled.
    for severity, window_s in (
        (DEGRADED, p.throttle_degraded_window_s),
        (SUSPECT, p.throttle_suspect_window_s),
    ):
        inside = _within(samples, now, window_s)
        if _covers(inside, window_s, p) and (share := _throttle_share(inside, index, p)) >= p.throttle_share:
            return [
                Evidence(
                    signal="throttle",
                    subject=f"gpu {index}",
                    severity=severity,
                    value=share,
                    threshold=p.throttle_share,
                    window_s=window_s,
                )
            ]
    return []


def _counter(
    samples: Sequence[NodeSample], index: int, now: float, window_s: float, read: Callable[[GpuSignals], int]
) -> int:
    return _increase([read(g) for s in _within(samples, now, window_s) if (g := _gpu(s, index)) is not None])


def _hard_findings(recent: Sequence[NodeSample]) -> list[Evidence]:
    """Uncorrectable ECC and fatal XIDs fail a node on one sample: the GPU's memory is no longer trusted.
    Any sample of the recent ``hard_window_s`` counts (a fatal XID between two calls is not missed);
    one finding per (signal, GPU), the latest. For an XID, value and threshold are both its code."""
    found: dict[tuple[str, int], Evidence] = {}
    for g in (g for s in recent for g in s.gpus):
        for signal, value, threshold, hit in (
            ("ecc_uncorrectable", g.ecc_uncorrectable, 1, g.ecc_uncorrectable > 0),
            ("xid", g.xid, g.xid, g.xid in FATAL_XIDS),
        ):
            if hit:
                found[(signal, g.index)] = Evidence(
                    signal=signal,
                    subject=f"gpu {g.index}",
                    severity=FAILED,
                    value=value,
                    threshold=threshold,
                    hard=True,
                )
    return [found[k] for k in sorted(found)]


def _gpu_findings(samples: Sequence[NodeSample], now: float, p: DetectionPolicy) -> list[Evidence]:
    out = _hard_findings(_within(samples, now, p.hard_window_s))
    for index in sorted({g.index for s in samples for g in s.gpus}):
        subject = f"gpu {index}"
        out += _throttle_findings(samples, index, now, p)
        ecc = _counter(samples, index, now, p.ecc_window_s, lambda g: g.ecc_corrected)
        out += _graded("ecc_corrected", subject, ecc, p.ecc_suspect, p.ecc_degraded, p.ecc_window_s)
        nvl = _counter(samples, index, now, p.nvlink_window_s, lambda g: g.nvlink_errors)
        out += _graded("nvlink_errors", subject, nvl, p.nvlink_suspect, p.nvlink_degraded, p.nvlink_window_s)
    return out


# --- per-NIC rules ---------------------------------------------------------------------------------------


def _down_for(ports: Sequence[tuple[float, NicSignals]]) -> float:
    """How long the port has been down in consecutive samples up to the latest (0: it is up)."""
    run = [at for at, n in _trailing(ports, lambda n: not n.link_up)]
    return run[-1] - run[0] if run else 0.0


def _trailing(
    ports: Sequence[tuple[float, NicSignals]], test: Callable[[NicSignals], bool]
) -> list[tuple[float, NicSignals]]:
    out: list[tuple[float, NicSignals]] = []
    for at, n in reversed(ports):
        if not test(n):
            break
        out.append((at, n))
    return out[::-1]


def _nic_findings(samples: Sequence[NodeSample], now: float, p: DetectionPolicy) -> list[Evidence]:
    out: list[Evidence] = []
    inside = _within(samples, now, p.nic_window_s)
    for name in sorted({n.name for s in inside for n in s.nics}):
        ports = [(s.at, n) for s in inside if (n := _nic(s, name)) is not None]
        subject = f"nic {name}"
        seen = sum(a.link_up and not b.link_up for (_, a), (_, b) in itertools.pairwise(ports))
        flaps = max(seen, _increase([n.link_downed for _, n in ports]))
        out += _graded("nic_flaps", subject, flaps, 1, p.nic_flaps_degraded, p.nic_window_s)
        down = _down_for(ports)
        if down >= p.nic_down_s:
            out.append(
                Evidence(
                    signal="nic_down", subject=subject, severity=DEGRADED, value=down, threshold=p.nic_down_s
                )
            )
        errors = _increase([n.errors for _, n in ports])
        out += _graded(
            "nic_errors", subject, errors, p.nic_errors_suspect, p.nic_errors_degraded, p.nic_window_s
        )
        out += _slow_nic(samples, name, now, p)
    return out


def _slow_nic(samples: Sequence[NodeSample], name: str, now: float, p: DetectionPolicy) -> list[Evidence]:
    """A link that trained down (400 -> 200 Gb/s) halves every collective through it; judged sustained."""
    inside = _within(samples, now, p.nic_slow_window_s)
    ports = [n for s in inside if (n := _nic(s, name)) is not None]
    if not _covers(inside, p.nic_slow_window_s, p) or not ports:
        return []
    slow = [n for n in ports if n.link_up and n.expected_speed_gbps and n.speed_gbps < n.expected_speed_gbps]
    if len(slow) < len(ports):
        return []
    return [
        Evidence(
            signal="nic_speed",
            subject=f"nic {name}",
            severity=DEGRADED,
            value=max(n.speed_gbps for n in slow),
            threshold=slow[-1].expected_speed_gbps or 0.0,
            window_s=p.nic_slow_window_s,
        )
    ]


# --- the state machine -----------------------------------------------------------------------------------


def _straggler_evidence(s: Straggler) -> Evidence:
    return Evidence(
        signal="straggler",
        subject=f"job {s.job_id} rank {s.rank}",
        severity=DEGRADED,
        value=s.step_time_s,
        threshold=s.k * s.gang_median_s,
        window_s=s.window_s,
    )


def _worst(findings: Sequence[Evidence]) -> str:
    return max((f.severity for f in findings), key=_RANK.__getitem__, default=HEALTHY)


def _enter(prev: NodeHealth, state: str, now: float, findings: Sequence[Evidence], hard: bool) -> NodeHealth:
    """Into ``state``, carrying the findings at least that bad (the numbers an event will carry)."""
    evidence = tuple(f for f in findings if _RANK[f.severity] >= _RANK[state])
    return msgspec.structs.replace(
        prev, state=state, since=now, hard=hard, evidence=evidence, clean_since=None
    )


def _step(prev: NodeHealth, findings: list[Evidence] | None, now: float, p: DetectionPolicy) -> NodeHealth:
    """The next verdict. ``findings`` None: no samples for this node in any window, which proves nothing
    either way: the state holds and no probation runs (only a sample heard is evidence of health)."""
    if prev.state == FAILED:
        return prev
    if findings is None:
        return msgspec.structs.replace(prev, clean_since=None)
    worst = _worst(findings)
    if worst == FAILED:
        return _enter(prev, FAILED, now, findings, hard=True)
    if worst == HEALTHY:
        return _probation(prev, now, p)
    if _RANK[worst] > _RANK[prev.state]:
        return _degrade(prev, worst, now, findings, p)
    # Same or milder: keep the state (and its evidence) and restart any probation.
    return msgspec.structs.replace(prev, clean_since=None)


def _degrade(
    prev: NodeHealth, worst: str, now: float, findings: list[Evidence], p: DetectionPolicy
) -> NodeHealth:
    if worst != DEGRADED:
        return _enter(prev, worst, now, findings, hard=False)
    recent = (*(t for t in prev.degraded_at if now - t <= p.repeat_window_s), now)
    if len(recent) >= p.repeat_limit:
        repeat = Evidence(
            signal="repeated_faults",
            subject="node",
            severity=FAILED,
            value=len(recent),
            threshold=p.repeat_limit,
            window_s=p.repeat_window_s,
            hard=True,
        )
        # Keep the degraded findings too: the operator needs to see what kept recurring.
        failed = _enter(msgspec.structs.replace(prev, degraded_at=recent), FAILED, now, [repeat], True)
        return msgspec.structs.replace(failed, evidence=(repeat, *findings))
    return _enter(msgspec.structs.replace(prev, degraded_at=recent), DEGRADED, now, findings, hard=False)


def _probation(prev: NodeHealth, now: float, p: DetectionPolicy) -> NodeHealth:
    if prev.state == HEALTHY:
        return prev if prev.clean_since is not None else msgspec.structs.replace(prev, clean_since=now)
    clean_since = now if prev.clean_since is None else prev.clean_since
    needed = p.suspect_clear_s if prev.state == SUSPECT else p.probation_s
    if now - clean_since >= needed:
        return msgspec.structs.replace(prev, state=HEALTHY, since=now, evidence=(), clean_since=clean_since)
    return msgspec.structs.replace(prev, clean_since=clean_since)


def _kind(after: NodeHealth) -> str:
    if after.state == HEALTHY:
        return "recovered"
    return "hard" if after.hard else "soft"


def _ordered(samples: Iterable[NodeSample]) -> dict[str, list[NodeSample]]:
    """Samples per node in time order; ties broken by content, so arrival order never matters."""
    by_node: dict[str, list[NodeSample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: (s.node_id, s.at, msgspec.json.encode(s))):
        by_node[s.node_id].append(s)
    return by_node


def detect(
    previous: Mapping[str, NodeHealth],
    samples: Iterable[NodeSample],
    steps: Iterable[RankStep],
    now: float,
    policy: DetectionPolicy = DEFAULT_POLICY,
) -> Verdict:
    """Each node's next health verdict, the transitions made, and the stragglers seen at ``now``.

    ``samples`` and ``steps``: whatever the caller holds of the recent past (older than the longest window
    is ignored, later than ``now`` too), in any order.
    """
    longest = max(
        policy.throttle_degraded_window_s,
        policy.ecc_window_s,
        policy.nvlink_window_s,
        policy.nic_window_s,
        policy.nic_slow_window_s,
    )
    by_node = _ordered(s for s in samples if now - longest <= s.at <= now)
    stragglers = find_stragglers(steps, now, policy.stragglers)
    node_ids = sorted(set(previous) | set(by_node) | {s.node_id for s in stragglers})
    nodes: list[NodeHealth] = []
    transitions: list[Transition] = []
    for node_id in node_ids:
        prev = previous.get(node_id) or NodeHealth(node_id=node_id, since=now)
        findings = _findings(
            by_node.get(node_id, []), [s for s in stragglers if s.node_id == node_id], now, policy
        )
        after = _step(prev, findings, now, policy)
        nodes.append(after)
        if after.state != prev.state:
            evidence = after.evidence if after.state != HEALTHY else prev.evidence
            transitions.append(
                Transition(
                    node_id=node_id,
                    from_state=prev.state,
                    to_state=after.state,
                    at=now,
                    kind=_kind(after),
                    evidence=evidence,
                )
            )
    return Verdict(nodes=tuple(nodes), transitions=tuple(transitions), stragglers=stragglers)


def _findings(
    samples: list[NodeSample], stragglers: list[Straggler], now: float, p: DetectionPolicy
) -> list[Evidence] | None:
    if not samples and not stragglers:
        return None
    out = [_straggler_evidence(s) for s in stragglers]
    if samples:
        out += _gpu_findings(samples, now, p) + _nic_findings(samples, now, p)
    return out
