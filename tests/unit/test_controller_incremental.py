"""The job controller reconciles only what changed, and misses nothing: after every event of random
histories, the jobs it acts on are exactly those a full pass over every job would act on."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from rallypoint_services.job_controller.controller import JobController
from test_state_indexes import next_event  # tests/unit is on the path: test basenames are unique

from rallypoint.control import Action, reconcile
from rallypoint.events import Event, JobSubmitted, LeaderEpochStarted
from rallypoint.runtime.follower import Follower
from rallypoint.state import ClusterState


class Recording:
    """A controller whose actions are recorded, not carried out (the state moves only by the events)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.follower = Follower(log=None)  # type: ignore[arg-type]  # fed by apply(), never by a log
        self.controller = JobController(
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            self.follower,
            clock=lambda: self.now,
            full_sweep_s=float("inf"),
        )
        self.acted: list[str] = []
        self.swept: list[str] = []
        self.controller._execute = self._record  # type: ignore[method-assign]
        self.controller._sweep = self._record_sweep  # type: ignore[method-assign]

    async def _record(self, job_id: str, actions: list[Action]) -> None:
        self.acted.append(job_id)

    async def _record_sweep(self, node_id: str) -> None:
        self.swept.append(node_id)

    async def a_pass(self) -> set[str]:
        self.acted.clear()
        self.swept.clear()
        await self.controller.reconcile_changed()
        for _ in range(3):  # the recorded "actions" end, as real ones would, before the next pass
            await asyncio.sleep(0)
        return set(self.acted)


def full_pass(state: ClusterState, now: float) -> set[str]:
    return {j.job_id for j in state.jobs.values() if reconcile(j, state, now)}


def came_back(state: ClusterState, seen: dict[str, str]) -> set[str]:
    """The nodes up again since the last pass (what a sweep of every node finds), updating ``seen``."""
    back = {n for n, node in state.nodes.items() if seen.get(n, "up") != "up" and node.status == "up"}
    seen.update((n, node.status) for n, node in state.nodes.items())
    return back


def with_time_limit(rng: random.Random, event: Event) -> Event:
    """Some jobs get a time limit: the one rule that acts without an event."""
    if isinstance(event, JobSubmitted) and rng.random() < 0.5:
        spec = msgspec.structs.replace(event.spec, time_limit_s=rng.choice((1, 3, 8)))
        return msgspec.structs.replace(event, spec=spec)
    return event


async def run_history(seed: int, length: int) -> None:
    rng = random.Random(seed)
    world = Recording()
    world.follower.apply(1, LeaderEpochStarted(epoch=1, leader_id="s", at=0.0))
    seen: dict[str, str] = {}
    for seq in range(2, length + 2):
        world.now += rng.choice((0.0, 0.5, 2.0))
        if rng.random() < 0.8:
            world.follower.apply(seq, with_time_limit(rng, next_event(rng, world.follower.state, world.now)))
        state = world.follower.state
        assert await world.a_pass() == full_pass(state, world.now), f"after seq {seq}"
        assert set(world.swept) == came_back(state, seen), f"after seq {seq}"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 150))
def test_an_incremental_pass_acts_on_exactly_the_jobs_a_full_pass_would(seed: int, length: int) -> None:
    asyncio.run(run_history(seed, length))


async def test_a_pass_after_one_event_reconciles_only_what_it_touched(monkeypatch: Any) -> None:
    rng = random.Random(3)
    world = Recording()
    world.follower.apply(1, LeaderEpochStarted(epoch=1, leader_id="s", at=0.0))
    for seq in range(2, 300):
        world.follower.apply(seq, next_event(rng, world.follower.state, float(seq)))
    acted = await world.a_pass()  # the first pass looks at everything
    assert acted == full_pass(world.follower.state, world.now)
    looked: list[str] = []
    monkeypatch.setattr(world.controller, "_reconcile_one", lambda state, job_id, now: looked.append(job_id))
    await world.a_pass()
    assert set(looked) == acted  # no event since: only the jobs whose actions ended are looked at again
    world.follower.apply(400, next_event(rng, world.follower.state, 400.0))
    looked.clear()
    await world.a_pass()
    assert len(looked) <= 10, looked  # the touched job, the gangs on its nodes: not every job
    assert len(world.follower.state.jobs) > 50
