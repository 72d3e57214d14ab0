"""``rally sim --from-log``'s what-if replays the recorded cluster and jobs with everything the scheduler
weighs: a node's CPU, memory, MIG GPUs, GPU memory, labels and taints; a job's CPU, memory, GPU share, MIG
profile, selector, tolerations and affinity (without them the what-if would place jobs the live cluster
could not)."""

from __future__ import annotations

import msgspec
from test_state_fold import LEADERS, bound, fold, node, submit

from rallypoint.events import Affinity, JobCompleted, JobStarted, JobSubmitted, TaskPlacement
from rallypoint.sim.fromlog import log_cluster, log_workload


def test_the_what_if_keeps_every_placement_rule_of_nodes_and_jobs() -> None:
    registered = node("n1", gpus=2)
    mig = (registered.gpus[0], msgspec.structs.replace(registered.gpus[1], mig=True))
    registered = msgspec.structs.replace(registered, gpus=mig, labels={"zone": "a"}, taints=("pool=serve",))
    plain = submit("j1", 1, per_task=1)
    spec = msgspec.structs.replace(
        plain.spec,
        ranks_per_task=1,
        cpu_milli=2000,
        memory_mib=4096,
        gpu_milli=250,
        gpu_memory_mib=8192,
        node_selector={"zone": "a"},
        tolerations=("pool",),
        affinity=(Affinity(group="web", level="rack", anti=True),),
    )
    state = fold(
        *LEADERS,
        registered,
        JobSubmitted(job_id="j1", spec=spec, submitted_at=plain.submitted_at),
        msgspec.structs.replace(
            bound("j1"), placements=(TaskPlacement(task=0, node_id="n1", gpus=(0,), milli=250),)
        ),
        JobStarted(job_id="j1", attempt=1, at=4.0),
        JobCompleted(job_id="j1", attempt=1, at=9.0),
    )
    (sim_node,) = log_cluster(state).nodes
    assert (sim_node.cpu, sim_node.memory, sim_node.mig_gpus) == (64_000, 512_000, (1,))
    assert (
        sim_node.gpu_memory == 80_000
        and sim_node.labels == {"zone": "a"}
        and sim_node.taints == ("pool=serve",)
    )
    (job,) = log_workload(state, t0=0.0)
    assert (job.cpu_milli, job.memory_mib, job.gpu_milli, job.gpu_memory_mib) == (2000, 4096, 250, 8192)
    assert (
        job.node_selector == {"zone": "a"} and job.tolerations == ("pool",) and job.affinity == spec.affinity
    )
