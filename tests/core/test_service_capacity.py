"""The GPUs a queue reserves for its services (``Queue.service_gpus``, the queue file's ``service_gpus``).

A queue's services hold at most its reserved GPUs together (those running and those bound in the same cycle);
a service beyond waits ``QuotaExceeded`` naming the service capacity, without asking for a preemption or a
reservation; the queue's other jobs are not capped by it; a queue that reserves nothing does not cap its
services; and a service inside its room is never a victim of training, whatever the classes.
"""

from __future__ import annotations

import pytest

from rallypoint.core import (
    ClusterModel,
    Decisions,
    PendingJob,
    Queue,
    Quota,
    Snapshot,
    policy_by_name,
    schedule,
)
from rallypoint.core.types import SERVICE
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import QueuesError, queues_from_obj

from .builders import cluster, nodes, pending, running

QUEUES = (
    Queue(name="serve", quotas=(Quota(nominal=16),), service_gpus=3),
    Queue(name="train", quotas=(Quota(nominal=16),)),
)


def _cycle(model: ClusterModel, jobs: list[PendingJob]) -> Decisions:
    snap = Snapshot(now=1.0, cluster=model, pending=tuple(jobs), queues=QUEUES)
    return schedule(snap, policy_by_name("rallypoint"))


def _reason(decisions: Decisions, job_id: str) -> tuple[str, str]:
    found = next(r for r in decisions.pending if r.job_id == job_id)
    return found.code, found.message


def test_services_fill_their_reserved_room_and_the_next_waits_naming_it() -> None:
    model = cluster(nodes(per_rack=2))
    jobs = [
        pending("web", 2, gpt=2, team="serve", service=True),
        pending("api", 2, gpt=2, submit=1.0, team="serve", service=True),  # 2 + 2 > 3: waits
        pending("batch", 4, gpt=4, submit=2.0, team="serve"),  # training of the same team: not capped
        pending("other", 2, gpt=2, submit=3.0, team="train", service=True),  # reserves nothing: no cap
    ]
    d = _cycle(model, jobs)
    assert sorted(b.job_id for b in d.binds) == ["batch", "other", "web"]
    code, message = _reason(d, "api")
    assert code == "QuotaExceeded", message
    assert message.startswith(
        "service capacity: queue serve's services hold 2 of its 3 reserved GPUs; needs 2"
    )
    assert not d.preemptions and not d.reservations


def test_running_services_count_and_a_service_larger_than_the_room_never_fits() -> None:
    model = cluster(nodes(per_rack=2), [running("web", {"s0r0n0": (0, 1)}, team="serve", service=True)])
    assert model.usage[("serve", SERVICE)] == 2 and ("train", SERVICE) not in model.usage
    d = _cycle(model, [pending("one", 1, team="serve", service=True)])
    assert [b.job_id for b in d.binds] == ["one"]
    model.unbind("web")
    assert model.usage.get(("serve", SERVICE), 0) == 0
    code, message = _reason(_cycle(model, [pending("big", 4, gpt=4, team="serve", service=True)]), "big")
    assert code == "QuotaExceeded" and "never fits: the queue reserves 3 for services" in message, message


def test_training_never_takes_a_services_room_by_preemption() -> None:
    # the cluster is full: a service of the lowest class and a best-effort training job hold it
    service = running(
        "web",
        {"s0r0n0": tuple(range(8))},
        team="serve",
        service=True,
        preemptible=False,
        priority_class="best-effort",
    )
    filler = running("fill", {"s0r0n1": tuple(range(8))}, team="train", priority_class="best-effort")
    model = cluster(nodes(per_rack=2), [service, filler])
    urgent = pending("urgent", 16, gpt=8, team="train", priority_class="training-high")
    d = _cycle(model, [urgent])
    assert "web" not in {p.victim_id for p in d.preemptions}, d.preemptions
    assert not d.binds


def test_the_queue_file_reserves_service_gpus_out_of_the_nominal() -> None:
    obj = {"teams": [{"name": "serve", "nominal": 8, "service_gpus": 4}, {"name": "train", "nominal": 8}]}
    queues, _classes = core_queues(queues_from_obj(obj))
    assert {q.name: q.service_gpus for q in queues} == {"serve": 4, "train": None}
    with pytest.raises(QueuesError, match="service_gpus must be between 0 and its nominal 8"):
        queues_from_obj({"teams": [{"name": "serve", "nominal": 8, "service_gpus": 9}]})
