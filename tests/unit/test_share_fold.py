"""The fold's GPU shares (``NodeView.shares``) through a node's re-registration."""

from __future__ import annotations

import msgspec
from test_state_fold import bound, fold, node, submit

from rallypoint.events import JobSubmitted


def test_a_restarted_agents_registration_keeps_its_gpus_shares() -> None:
    plain = submit("nb", 1, per_task=1)
    share = JobSubmitted(
        job_id="nb",
        spec=msgspec.structs.replace(plain.spec, gpu_milli=300, ranks_per_task=1),
        submitted_at=plain.submitted_at,
    )
    state = fold(node("n1"), share, bound("nb", ("n1", (0,))))
    assert state.nodes["n1"].shares == {0: {"nb": 300}}
    state.apply(state.last_seq + 1, msgspec.structs.replace(node("n1"), agent_instance="a2", at=9.0))
    assert state.nodes["n1"].shares == {0: {"nb": 300}} and state.nodes["n1"].allocated == {0: "nb"}
