"""MIG geometry (issue 32): the profile tables and carve(), against an oracle that enumerates every valid
layout of a GPU from the placements alone.

The oracle knows nothing of carve's bit masks or preferences: a layout is a set of (profile, start)
placements whose memory-slice ranges do not meet. A request is holdable when some layout contains every
busy instance where it is plus one instance of the profile (idle instances may be destroyed). The property:
over random sequences of requests and releases, carve never refuses a holdable request, and what it
returns is such a layout.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.core.mig import MIG_MODELS, MigInstance, MigModel, carve, free_mask, mig_model

Placement = tuple[str, int]


def _slices(model: MigModel, placement: Placement) -> frozenset[int]:
    name, start = placement
    size = model.profile(name).size
    return frozenset(range(start, start + size))


@cache
def _layouts(model: MigModel) -> frozenset[frozenset[Placement]]:
    """Every valid layout (any number of instances, the empty one too), by plain recursion."""
    placements = [(p.name, s) for p in model.profiles for s in p.starts]
    found: set[frozenset[Placement]] = set()

    def grow(i: int, chosen: frozenset[Placement], used: frozenset[int]) -> None:
        if i == len(placements):
            found.add(chosen)
            return
        grow(i + 1, chosen, used)
        cells = _slices(model, placements[i])
        if not cells & used:
            grow(i + 1, chosen | {placements[i]}, used | cells)

    grow(0, frozenset(), frozenset())
    return frozenset(found)


def _holdable(model: MigModel, instances: list[MigInstance], profile: str) -> bool:
    busy = {(i.profile, i.start) for i in instances if i.busy}
    return any(
        busy <= layout and any(name == profile and (name, s) not in busy for name, s in layout)
        for layout in _layouts(model)
    )


def test_each_profile_s_instance_count_is_nvidia_s() -> None:
    """The most instances of one profile a GPU holds, as the MIG User Guide's tables list them."""
    expected = {"1g": 7, "2g": 3, "3g": 2, "4g": 1, "7g": 1}
    for model in MIG_MODELS:
        for p in model.profiles:
            most = max(sum(1 for name, _ in layout if name == p.name) for layout in _layouts(model))
            want = 4 if p.compute == 1 and p.size == 2 else expected[p.name.split(".")[0]]
            assert most == want, (model.name, p.name)


def test_no_layout_needs_more_than_seven_compute_slices() -> None:
    for model in MIG_MODELS:
        for layout in _layouts(model):
            assert sum(model.profile(name).compute for name, _ in layout) <= 7, (model.name, layout)


def test_documented_mixes() -> None:
    """Combinations the guide draws (4g+3g, 4g+2g+1g, 3g+2g+1g+1g) fit; 4g+4g and 3g+3g+1g do not."""
    a100 = mig_model("A100-SXM4-40GB")
    assert a100 is not None and a100.name == "A100-40GB"
    layouts = _layouts(a100)

    def fits(*names: str) -> bool:
        return any(sorted(n for n, _ in layout) == sorted(names) for layout in layouts)

    assert fits("4g.20gb", "3g.20gb")
    assert fits("4g.20gb", "2g.10gb", "1g.5gb")
    assert fits("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")
    assert not fits("4g.20gb", "4g.20gb")
    assert not fits("3g.20gb", "3g.20gb", "1g.5gb")
    assert mig_model("h100") is not None and mig_model("V100") is None


def test_carve_reuses_an_idle_instance_of_the_profile() -> None:
    h100 = MIG_MODELS[2]
    instances = [MigInstance("3g.40gb", 0, busy=True), MigInstance("1g.10gb", 5), MigInstance("1g.10gb", 4)]
    got = carve(h100, instances, "1g.10gb")
    assert got is not None and (got.start, got.create, got.destroy) == (4, False, ())


def test_carve_destroys_idle_instances_only_when_it_must() -> None:
    h100 = MIG_MODELS[2]
    # seven idle 1g slices: a 3g request must destroy three of them, at the start that keeps busy 1g@1
    instances = [MigInstance("1g.10gb", s, busy=s == 1) for s in range(7)]
    got = carve(h100, instances, "3g.40gb")
    assert got is not None and (got.start, got.create, got.destroy) == (4, True, (4, 5, 6))
    assert carve(h100, [MigInstance("7g.80gb", 0, busy=True)], "1g.10gb") is None
    assert free_mask(h100, instances) == 0b1000_0000


def test_carve_leaves_room_for_larger_requests() -> None:
    """A 1g on an empty GPU goes where it blocks fewest placements: not at 0 (which blocks 4g and 7g)."""
    h100 = MIG_MODELS[2]
    got = carve(h100, [], "1g.10gb")
    assert got is not None and got.start == 6
    after = [MigInstance("1g.10gb", 6, busy=True)]
    four = carve(h100, after, "4g.40gb")
    assert four is not None and four.start == 0


def test_unknown_profile_is_named() -> None:
    with pytest.raises(KeyError, match=r"H100-80GB has no MIG profile '1g\.5gb'"):
        carve(MIG_MODELS[2], [], "1g.5gb")


_step = st.tuples(st.sampled_from(["ask", "release", "drop"]), st.integers(0, 5), st.integers(0, 15))


@settings(max_examples=300, deadline=None)
@given(model_index=st.integers(0, len(MIG_MODELS) - 1), steps=st.lists(_step, max_size=40))
def test_carve_never_refuses_what_a_relayout_would_hold(
    model_index: int, steps: list[tuple[str, int, int]]
) -> None:
    model = MIG_MODELS[model_index]
    instances: list[MigInstance] = []
    for action, profile_index, pick in steps:
        if action == "ask":
            profile = model.profiles[profile_index].name
            got = carve(model, instances, profile)
            assert (got is not None) == _holdable(model, instances, profile), (instances, profile)
            if got is None:
                continue
            if got.create:
                assert set(got.destroy) <= {i.start for i in instances if not i.busy}, "only idle ones go"
                instances = [i for i in instances if i.busy or i.start not in got.destroy]
                instances.append(MigInstance(profile, got.start, busy=True))
            else:
                assert got.destroy == ()
                instances = [
                    MigInstance(i.profile, i.start, busy=True)
                    if (i.profile, i.start) == (profile, got.start)
                    else i
                    for i in instances
                ]
            assert frozenset((i.profile, i.start) for i in instances) in _layouts(model), instances
        elif action == "release" and instances:
            i = instances[pick % len(instances)]
            instances[pick % len(instances)] = MigInstance(i.profile, i.start, busy=False)
        elif action == "drop" and instances and not instances[pick % len(instances)].busy:
            del instances[pick % len(instances)]
