"""Health detection as data: given a node's signals over time, when ``detect`` runs every tick, then its
state at chosen instants is as the table says. Times are seconds since the first sample; one sample per
``TICK`` (the agent beats every second; five keeps the tables short and changes no threshold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.health.detection import (
    DEGRADED,
    FAILED,
    HEALTHY,
    SUSPECT,
    DetectionPolicy,
    GpuSignals,
    NicSignals,
    NodeHealth,
    NodeSample,
    Transition,
    Verdict,
    detect,
)
from rallypoint.health.stragglers import RankStep, StragglerPolicy

TICK = 5.0
POLICY = DetectionPolicy()
ORDER = {HEALTHY: 0, SUSPECT: 1, DEGRADED: 2, FAILED: 3}

Gpu = Callable[[float], GpuSignals]
Nic = Callable[[float], NicSignals]


def clean_gpu(t: float) -> GpuSignals:
    return GpuSignals(index=0, temperature_c=60.0)


def clean_nic(t: float) -> NicSignals:
    return NicSignals(name="ib0", link_up=True, speed_gbps=400.0, expected_speed_gbps=400.0)


def at(times: set[float], then: Gpu, otherwise: Gpu = clean_gpu) -> Gpu:
    return lambda t: then(t) if t in times else otherwise(t)


def nic_at(test: Callable[[float], bool], then: Nic) -> Nic:
    return lambda t: then(t) if test(t) else clean_nic(t)


def ecc_storm(start: float, end: float, per_tick: int) -> Gpu:
    """Corrected ECC rising ``per_tick`` a sample from ``start`` to ``end``, then flat."""
    return lambda t: GpuSignals(
        index=0, temperature_c=60.0, ecc_corrected=int(per_tick * (min(max(t, start), end) - start) / TICK)
    )


def ib_down(t: float) -> NicSignals:
    return NicSignals(name="ib0", link_up=False, speed_gbps=0.0, expected_speed_gbps=400.0)


def ib_200(t: float) -> NicSignals:
    return NicSignals(name="ib0", link_up=True, speed_gbps=200.0, expected_speed_gbps=400.0)


@dataclass(frozen=True)
class Case:
    name: str
    gpu: Gpu = clean_gpu
    nic: Nic = clean_nic
    run_s: float = 1200.0
    #: (t, state): the node's state right after the tick at t.
    expect: tuple[tuple[float, str], ...] = ()
    #: The worst state the node may reach over the whole run (a blip: healthy).
    worst: str | None = None
    hard: bool = False
    signals: frozenset[str] = field(default_factory=frozenset)


CASES = [
    Case(
        name="a one-sample temperature blip does not leave healthy",
        gpu=at({400.0}, lambda t: GpuSignals(index=0, temperature_c=97.0, throttle_thermal=True)),
        worst=HEALTHY,
    ),
    Case(
        name="a one-sample HW slowdown does not leave healthy",
        gpu=at({400.0}, lambda t: GpuSignals(index=0, temperature_c=60.0, throttle_hw_slowdown=True)),
        worst=HEALTHY,
    ),
    Case(
        name="sustained thermal throttling: suspect at half of a minute throttled, degraded at half of five",
        gpu=lambda t: GpuSignals(
            index=0, temperature_c=92.0 if t >= 400 else 60.0, throttle_thermal=t >= 400
        ),
        expect=((425.0, HEALTHY), (430.0, SUSPECT), (545.0, SUSPECT), (550.0, DEGRADED)),
        signals=frozenset({"throttle"}),
    ),
    Case(
        name="sustained power-brake throttling degrades the same way",
        gpu=lambda t: GpuSignals(index=0, temperature_c=60.0, throttle_power_brake=t >= 400),
        expect=((430.0, SUSPECT), (550.0, DEGRADED)),
        signals=frozenset({"throttle"}),
    ),
    Case(
        name="a node heard only briefly is not judged on share rules (no window coverage)",
        gpu=lambda t: GpuSignals(index=0, temperature_c=95.0, throttle_thermal=True),
        run_s=45.0,
        worst=HEALTHY,
    ),
    Case(
        name="corrected-ECC storm (20 a sample): suspect at 10, degraded at 100 in the window",
        gpu=ecc_storm(400.0, 10_000.0, 20),
        expect=((400.0, HEALTHY), (405.0, SUSPECT), (420.0, SUSPECT), (425.0, DEGRADED)),
        signals=frozenset({"ecc_corrected"}),
    ),
    Case(
        name="a corrected-ECC trickle (one every two minutes) stays healthy",
        gpu=lambda t: GpuSignals(index=0, ecc_corrected=int(t // 120)),
        run_s=3000.0,
        worst=HEALTHY,
    ),
    Case(
        name="uncorrectable ECC fails the node at once, and it stays failed after clean samples",
        gpu=at({400.0}, lambda t: GpuSignals(index=0, ecc_uncorrectable=1)),
        run_s=4000.0,
        expect=((395.0, HEALTHY), (400.0, FAILED), (4000.0, FAILED)),
        hard=True,
        signals=frozenset({"ecc_uncorrectable"}),
    ),
    Case(
        name="a fatal XID (79, fallen off the bus) fails the node for good",
        gpu=at({400.0}, lambda t: GpuSignals(index=0, xid=79)),
        run_s=4000.0,
        expect=((400.0, FAILED), (4000.0, FAILED)),
        hard=True,
        signals=frozenset({"xid"}),
    ),
    Case(
        name="an application XID (13) is the job's problem, not the node's",
        gpu=at({400.0}, lambda t: GpuSignals(index=0, xid=13)),
        worst=HEALTHY,
    ),
    Case(
        name="an NVLink error storm degrades",
        gpu=lambda t: GpuSignals(index=0, nvlink_errors=int(max(0.0, t - 400) * 10 / TICK)),
        expect=((400.0, HEALTHY), (405.0, SUSPECT), (450.0, DEGRADED)),
        signals=frozenset({"nvlink_errors"}),
    ),
    Case(
        name="a NIC flapping down/up 3 times in ten minutes: suspect at the first, degraded at the third",
        nic=nic_at(lambda t: t in {400.0, 500.0, 600.0}, ib_down),
        expect=((395.0, HEALTHY), (400.0, SUSPECT), (595.0, SUSPECT), (600.0, DEGRADED)),
        signals=frozenset({"nic_flaps"}),
    ),
    Case(
        name="one NIC flap: suspect while it is in the window, healthy a clean minute after",
        nic=nic_at(lambda t: t == 400.0, ib_down),
        run_s=1200.0,
        expect=((400.0, SUSPECT), (1055.0, SUSPECT), (1060.0, HEALTHY)),
    ),
    Case(
        name="a NIC that stays down: degraded after 10 s",
        nic=nic_at(lambda t: t >= 400, ib_down),
        expect=((400.0, SUSPECT), (405.0, SUSPECT), (410.0, DEGRADED)),
        signals=frozenset({"nic_down"}),
    ),
    Case(
        name="a NIC trained down to 200 of 400 Gb/s for a minute: degraded",
        nic=nic_at(lambda t: t >= 400, ib_200),
        expect=((455.0, HEALTHY), (460.0, DEGRADED)),
        signals=frozenset({"nic_speed"}),
    ),
    Case(
        name="NIC receive errors rising 50 a sample: suspect at 100, degraded at 1000 in the window",
        nic=lambda t: NicSignals(name="ib0", speed_gbps=400.0, errors=int(max(0.0, t - 400) * 50 / TICK)),
        expect=((405.0, HEALTHY), (410.0, SUSPECT), (495.0, SUSPECT), (500.0, DEGRADED)),
        signals=frozenset({"nic_errors"}),
    ),
    Case(
        name="probation: a soft fault returns to healthy only after the clean window (15 min)",
        # storm 400-430 (120 errors); its last increase leaves the 10-minute window at 1030; clean from then
        gpu=ecc_storm(400.0, 430.0, 20),
        run_s=2500.0,
        expect=((425.0, DEGRADED), (1030.0, DEGRADED), (1925.0, DEGRADED), (1930.0, HEALTHY)),
    ),
    Case(
        name="probation restarts on any finding: a NIC flap at 1500 pushes the return to 3000",
        gpu=ecc_storm(400.0, 430.0, 20),
        nic=nic_at(lambda t: t == 1500.0, ib_down),
        run_s=3200.0,
        expect=((1930.0, DEGRADED), (2995.0, DEGRADED), (3000.0, HEALTHY)),
    ),
]


def simulate(case: Case) -> tuple[dict[float, NodeHealth], list[Transition]]:
    previous: dict[str, NodeHealth] = {}
    history: list[NodeSample] = []
    states: dict[float, NodeHealth] = {}
    transitions: list[Transition] = []
    t = 0.0
    while t <= case.run_s:
        history.append(NodeSample(node_id="n1", at=t, gpus=(case.gpu(t),), nics=(case.nic(t),)))
        verdict = detect(previous, history, (), t, POLICY)
        previous = {h.node_id: h for h in verdict.nodes}
        states[t] = previous["n1"]
        transitions += verdict.transitions
        t += TICK
    return states, transitions


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_health(case: Case) -> None:
    states, transitions = simulate(case)
    for when, state in case.expect:
        assert states[when].state == state, f"at t={when}: {states[when]}"
    if case.worst is not None:
        reached = max((h.state for h in states.values()), key=ORDER.__getitem__)
        assert reached == case.worst, [tr for tr in transitions]
    final = states[max(states)]
    assert final.hard == case.hard
    for tr in transitions:
        # every move away from healthy carries the numbers that justify it
        assert tr.to_state == HEALTHY or tr.evidence, tr
        assert tr.kind == (
            "recovered" if tr.to_state == HEALTHY else "hard" if tr.to_state == FAILED else "soft"
        )
    seen = {e.signal for tr in transitions for e in tr.evidence}
    assert case.signals <= seen, (case.signals, seen)


def test_evidence_names_value_threshold_and_window() -> None:
    _, transitions = simulate(CASES[5])  # the corrected-ECC storm
    degraded = next(tr for tr in transitions if tr.to_state == DEGRADED)
    (ecc,) = degraded.evidence
    assert (ecc.signal, ecc.subject, ecc.value, ecc.threshold, ecc.window_s) == (
        "ecc_corrected",
        "gpu 0",
        100,
        100,
        600.0,
    )


def test_repeated_soft_faults_fail_the_node() -> None:
    prev = NodeHealth(node_id="n1", state=HEALTHY, degraded_at=(1000.0, 20_000.0))
    samples = [NodeSample(node_id="n1", at=t, nics=(ib_down(t),)) for t in (50_000.0, 50_005.0, 50_010.0)]
    verdict = detect({"n1": prev}, samples, (), 50_010.0)
    (node,) = verdict.nodes
    assert (node.state, node.hard) == (FAILED, True)
    assert {e.signal for e in node.evidence} >= {"repeated_faults", "nic_down"}
    # outside 24 h the old episodes no longer count
    old = NodeHealth(node_id="n1", degraded_at=(-40_000.0, -39_000.0))
    (node,) = detect({"n1": old}, samples, (), 50_010.0).nodes
    assert (node.state, node.hard) == (DEGRADED, False)


def test_silence_is_not_health() -> None:
    """No samples: the state holds and no probation runs (liveness judges silence, not this module)."""
    prev = NodeHealth(node_id="n1", state=DEGRADED, since=0.0, clean_since=100.0)
    (node,) = detect({"n1": prev}, [], (), 5000.0).nodes
    assert (node.state, node.clean_since) == (DEGRADED, None)


# --- stragglers -------------------------------------------------------------------------------------------


def gang(
    times: dict[str, float], job: str = "j1", ranks_per_node: int = 8, span: float = 300.0
) -> list[RankStep]:
    """Every rank of every node reports its step time every 10 s over the last ``span`` s before 1000."""
    return [
        RankStep(
            job_id=job, node_id=node, rank=i * ranks_per_node + r, at=1000.0 - span + s, step_time_s=step
        )
        for i, (node, step) in enumerate(sorted(times.items()))
        for r in range(ranks_per_node)
        for s in range(0, int(span) + 1, 10)
    ]


def reports(node: str, ranks: range | list[int], phases: list[tuple[int, int, float]]) -> list[RankStep]:
    """Each rank of ``node`` reports every 10 s: ``step_time`` from ``start`` to ``end`` (inclusive)."""
    return [
        RankStep(job_id="j1", node_id=node, rank=r, at=float(t), step_time_s=step)
        for r in ranks
        for start, end, step in phases
        for t in range(start, end + 1, 10)
    ]


NORMAL = {f"n{i}": 1.0 for i in range(1, 8)}
STRAGGLER_CASES = [
    ("one node of 8 at 1.5x the median for the window", gang({**NORMAL, "n8": 1.5}), {"n8"}),
    (
        "a uniformly slow gang (a slow model) has no straggler",
        gang({f"n{i}": 3.0 for i in range(1, 9)}),
        set(),
    ),
    ("1.3x stays under k = 1/0.7", gang({**NORMAL, "n8": 1.3}), set()),
    (
        "a gang of 2: no verdict, even at 3x (no majority)",
        gang({"n1": 1.0, "n2": 3.0}, ranks_per_node=1),
        set(),
    ),
    (
        "a gang of 3 one-rank nodes: enough peers",
        gang({"n1": 1.0, "n2": 1.0, "n3": 1.5}, ranks_per_node=1),
        {"n3"},
    ),
    (
        "slow for only the last minute: the window median is unmoved",
        gang(NORMAL) + reports("n8", range(56, 64), [(700, 940, 1.0), (950, 1000, 1.6)]),
        set(),
    ),
    (
        "slow but heard for only a minute: not yet 'for the window'",
        gang(NORMAL) + gang({"n8": 2.0}, span=60),
        set(),
    ),
    (
        "slow for most of the window: flagged",
        gang(NORMAL) + reports("n8", range(56, 64), [(700, 800, 1.0), (810, 1000, 1.6)]),
        {"n8"},
    ),
    (
        "one slow rank of a node's eight flags the node",
        gang(NORMAL)
        + reports("n8", range(56, 63), [(700, 1000, 1.0)])
        + reports("n8", [63], [(700, 1000, 2.0)]),
        {"n8"},
    ),
]


@pytest.mark.parametrize(("name", "steps", "flagged"), STRAGGLER_CASES, ids=[c[0] for c in STRAGGLER_CASES])
def test_stragglers(name: str, steps: list[RankStep], flagged: set[str]) -> None:
    verdict = detect({}, [], steps, 1000.0)
    assert {s.node_id for s in verdict.stragglers} == flagged
    for s in verdict.stragglers:
        assert s.step_time_s > s.k * s.gang_median_s
    degraded = {n.node_id for n in verdict.nodes if n.state == DEGRADED}
    assert degraded == flagged


def test_straggler_evidence() -> None:
    verdict = detect({}, [], gang({**NORMAL, "n8": 1.5}), 1000.0)
    (s,) = verdict.stragglers
    assert (s.node_id, s.job_id, s.step_time_s, s.gang_median_s, s.window_s) == ("n8", "j1", 1.5, 1.0, 300.0)
    assert s.k == pytest.approx(1 / 0.7)
    (tr,) = verdict.transitions
    (e,) = tr.evidence
    assert (tr.to_state, tr.kind, e.signal, e.value) == (DEGRADED, "soft", "straggler", 1.5)
    assert e.threshold == pytest.approx(1.5 / 1.05)  # k x median = 1/0.7 s


def test_straggler_policy_is_tunable() -> None:
    policy = DetectionPolicy(stragglers=StragglerPolicy(k=1.2))
    verdict = detect({}, [], gang({**NORMAL, "n8": 1.3}), 1000.0, policy)
    assert [s.node_id for s in verdict.stragglers] == ["n8"]


# --- order independence -----------------------------------------------------------------------------------

gpus = st.builds(
    GpuSignals,
    index=st.integers(0, 1),
    temperature_c=st.sampled_from([60.0, 95.0]),
    throttle_thermal=st.booleans(),
    throttle_hw_slowdown=st.booleans(),
    ecc_corrected=st.integers(0, 300),
    ecc_uncorrectable=st.sampled_from([0, 0, 0, 1]),
    xid=st.sampled_from([0, 0, 13, 79]),
    nvlink_errors=st.integers(0, 300),
)
nics = st.builds(
    NicSignals,
    name=st.just("ib0"),
    link_up=st.booleans(),
    speed_gbps=st.sampled_from([200.0, 400.0]),
    expected_speed_gbps=st.just(400.0),
    errors=st.integers(0, 3000),
)
samples = st.lists(
    st.builds(
        NodeSample,
        node_id=st.sampled_from(["n1", "n2", "n3"]),
        # half of them at one of two instants: ties, where an order could show through
        at=st.one_of(st.integers(0, 600).map(float), st.sampled_from([590.0, 600.0])),
        gpus=st.lists(gpus, max_size=2).map(tuple),
        nics=st.lists(nics, max_size=1).map(tuple),
    ),
    max_size=40,
)
steps = st.lists(
    st.builds(
        RankStep,
        job_id=st.sampled_from(["a", "b"]),
        node_id=st.sampled_from(["n1", "n2", "n3", "n4"]),
        rank=st.integers(0, 3),
        at=st.integers(0, 600).map(float),
        step_time_s=st.sampled_from([1.0, 1.1, 2.0]),
    ),
    max_size=60,
)
states = st.dictionaries(
    st.sampled_from(["n1", "n2", "n3"]),
    st.sampled_from([HEALTHY, SUSPECT, DEGRADED]),
)


def _previous(given_states: dict[str, str]) -> dict[str, NodeHealth]:
    return {n: NodeHealth(node_id=n, state=s, since=0.0) for n, s in given_states.items()}


@settings(max_examples=50, deadline=None)
@given(samples=samples, steps=steps, prior=states, rnd=st.randoms(use_true_random=False))
def test_verdict_is_deterministic_and_order_free(
    samples: list[NodeSample], steps: list[RankStep], prior: dict[str, str], rnd: object
) -> None:
    """Three other orders of each example: drawing an example costs far more than judging it."""
    import random

    assert isinstance(rnd, random.Random)
    previous = _previous(prior)
    first: Verdict = detect(previous, samples, steps, 600.0)
    reordered_prev = dict(sorted(previous.items(), reverse=True))
    for _ in range(3):
        shuffled_samples, shuffled_steps = list(samples), list(steps)
        rnd.shuffle(shuffled_samples)
        rnd.shuffle(shuffled_steps)
        assert detect(reordered_prev, shuffled_samples, shuffled_steps, 600.0) == first
    assert detect(previous, samples, steps, 600.0) == first


def test_a_fatal_xid_between_calls_is_not_missed_and_an_operator_clear_holds() -> None:
    batch = [
        NodeSample(node_id="n1", at=t, gpus=(GpuSignals(index=0, xid=79 if t == 10.0 else 0),))
        for t in (5.0, 10.0, 15.0, 20.0)
    ]
    (node,) = detect({}, batch, (), 20.0).nodes
    assert (node.state, node.hard, node.evidence[0].value) == (FAILED, True, 79)
    # An operator clears the node (the caller forgets the verdict); clean samples keep it healthy.
    later = [NodeSample(node_id="n1", at=t, gpus=(GpuSignals(index=0),)) for t in (60.0, 65.0)]
    (node,) = detect({}, batch + later, (), 65.0).nodes
    assert node.state == HEALTHY
