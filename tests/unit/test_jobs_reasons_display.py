"""`rally jobs`' NODES(REASON) column: the scheduler's code, the job's place and the reason's numbers for a
pending job; a job cancelled before it was placed says so instead of "(None)"."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.cli.jobs_cmds import nodes_or_reason


def job(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"state": "pending", "nodes": [], "reason": None, "queue_position": None}
    return base | over


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        (
            {
                "pending_reason": {
                    "code": "Resources",
                    "message": "needs 16 GPUs in the cluster; 8 free; 1 job ahead",
                    "jobs_ahead": 1,
                },
                "queue_position": 2,
            },
            "(Resources, #2: needs 16 GPUs in the cluster; 8 free; 1 job ahead)",
        ),
        (
            {"pending_reason": {"code": "AwaitingScheduler", "message": "submitted; not looked at yet"}},
            "(AwaitingScheduler: submitted; not looked at yet)",
        ),
        ({"pending_reason": None}, "(AwaitingScheduler)"),
        ({"state": "cancelled"}, "(Cancelled)"),
        ({"state": "cancelled", "nodes": ["n0", "n1"]}, "n[0-1]"),
        ({"state": "rejected", "reason": "can never run here: no node has GPU type B200"},
         "(can never run here: no node has GPU type B200)"),
    ],
)  # fmt: skip
def test_reason_column(fields: dict[str, Any], shown: str) -> None:
    assert nodes_or_reason(job(**fields)) == shown
