"""An operator's labels and taints (``NodeRulesSet``) on the fold: on top of the agent's, replaced by the
next set, kept through the agent's re-registration, and handed to the scheduler's core."""

from __future__ import annotations

import msgspec
from test_state_fold import fold, node

from rallypoint.events import NodeRulesSet
from rallypoint.scheduling.bridge import node_of


def test_operator_rules_sit_on_the_agents_and_survive_a_reregistration() -> None:
    agent = msgspec.structs.replace(node("n1"), labels={"zone": "a", "ib": "hdr"}, taints=("gpu=old",))
    state = fold(agent)
    rules = NodeRulesSet(
        node_id="n1", labels={"zone": "b"}, taints=("dedicated=serve",), set_by="ops", at=5.0
    )
    state.apply(state.last_seq + 1, rules)
    view = state.nodes["n1"]
    assert view.labels == {"zone": "b", "ib": "hdr"}  # the operator's label wins for its key
    assert view.taints == ("dedicated=serve", "gpu=old")
    assert node_of(view).taints == ("dedicated=serve", "gpu=old")

    state.apply(state.last_seq + 1, msgspec.structs.replace(agent, agent_instance="a2", at=9.0))
    assert state.nodes["n1"].labels == {"zone": "b", "ib": "hdr"}
    assert state.nodes["n1"].taints == ("dedicated=serve", "gpu=old")

    state.apply(state.last_seq + 1, NodeRulesSet(node_id="n1", set_by="ops", at=10.0))  # an empty set clears
    assert state.nodes["n1"].labels == {"zone": "a", "ib": "hdr"} and state.nodes["n1"].taints == ("gpu=old",)


def test_rules_for_an_unknown_node_change_nothing() -> None:
    state = fold(node("n1"))
    state.apply(state.last_seq + 1, NodeRulesSet(node_id="nx", taints=("a",), set_by="ops", at=1.0))
    assert set(state.nodes) == {"n1"} and state.nodes["n1"].taints == ()
