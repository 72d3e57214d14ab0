"""The live scheduler syncs its model from what the fold touched (``ModelSync.sync(state, changed)``).

Only the jobs and nodes the applied events touched are looked at; the model must still decide byte for
byte as one built from scratch, after any history, or the audit would flag the live scheduler's decisions.
The touched ids come from the real fold (``ClusterState.apply``) through the follower's change feed.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_model_sync import OPS, QUEUES, World, _busy_world, _step, assert_same

from rallypoint.events import Event, NodeHealthChanged
from rallypoint.runtime.changes import ChangeSet
from rallypoint.scheduling import ModelSync, build_snapshot


class FedWorld(World):
    """A World whose every applied event feeds a change feed, as the follower's does."""

    def __init__(self) -> None:
        super().__init__()
        self.feed = ChangeSet()

    def apply(self, event: Event) -> None:
        self.seq += 1
        self.now += 1.0
        self.feed.add(self.state.apply(self.seq, event))


def _fed(world: World) -> FedWorld:
    fed = FedWorld()
    fed.state, fed.seq, fed.now, fed.jobs = world.state, world.seq, world.now, world.jobs
    return fed


def assert_same_touched(sync: ModelSync, w: FedWorld) -> None:
    """The synced snapshot (from the touched ids) decides as a fresh one; checked by ``assert_same`` on
    a sync that has nothing left to apply, after the touched sync did the work."""
    fresh = build_snapshot(w.state, w.now, queues=QUEUES)
    synced = sync.snapshot(w.state, w.now, queues=QUEUES, changed=w.feed.take())
    assert synced.cluster.running == fresh.cluster.running
    assert synced.cluster.nodes == fresh.cluster.nodes
    assert synced.pending == fresh.pending
    assert_same(sync, w.state, w.now)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000)), min_size=5, max_size=40))
def test_random_histories_synced_from_what_the_fold_touched_decide_identically(
    steps: list[tuple[str, int]],
) -> None:
    w = _fed(_busy_world())
    sync = ModelSync()
    assert_same_touched(sync, w)  # the feed's first take says everything: a full comparison
    for op, pick in steps:
        incremental = sync.counts.incremental
        _step(w, op, pick)
        assert_same_touched(sync, w)
        assert sync.counts.incremental == incremental + 1


def test_only_the_touched_jobs_are_applied() -> None:
    w = _fed(_busy_world())
    sync = ModelSync()
    assert_same_touched(sync, w)
    binds = sync.counts.binds
    job = w.submit(8, priority="production")
    w.apply_decisions()
    assert_same_touched(sync, w)
    assert sync.counts.binds == binds + (w.state.jobs[job].state == "bound")


def test_a_node_whose_health_changes_in_place_is_seen_by_both_ways_of_syncing() -> None:
    """The fold changes a node's health in place: the full comparison must look at it as at its status."""
    for touched in (True, False):
        w = _fed(_busy_world())
        sync = ModelSync()
        assert_same_touched(sync, w)
        node = sorted(w.state.nodes)[0]
        w.apply(NodeHealthChanged(node_id=node, state="degraded", previous="healthy", at=w.now))
        assert not w.state.nodes[node].schedulable
        if touched:
            assert_same_touched(sync, w)
        else:
            w.feed.take()
            assert_same(sync, w.state, w.now)
        assert not sync.model.nodes[node].schedulable


def test_another_state_or_a_replaced_one_is_compared_in_full() -> None:
    w = _fed(_busy_world())
    sync = ModelSync()
    assert_same_touched(sync, w)
    other = _fed(_busy_world())
    other.submit(8, priority="production")
    other.apply_decisions()
    incremental = sync.counts.incremental
    # the feed of one state says nothing about another: the ids would be wrong, so they are not used
    assert_same_touched(sync, other)
    w.feed.invalidate()  # a follower that restored a snapshot
    assert_same_touched(sync, w)
    assert sync.counts.incremental == incremental
