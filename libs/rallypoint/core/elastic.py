"""Elastic gangs: grow running gangs into idle GPUs when nobody waits for GPUs.

Starting between min and max is the engine's job (``engine.job_sizes``); shrinking before preemption is
the preemptor's first kind of action. Growth is the last step of a cycle and only happens when no pending
job is left waiting for GPUs (waiting on quota does not block growth, even when its reason names the
GPUs that are short too), so idle GPUs are lent to elastic gangs and taken back by shrinking when someone
needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rallypoint.core.context import Ctx
from rallypoint.core.placement import bits
from rallypoint.core.types import PendingReason, Resize, TaskPlacement
from rallypoint.core.units import GPU_MILLI

__all__ = ["ElasticGrower", "Grower"]

_WAITS_FOR_GPUS = frozenset(
    {"Resources", "Topology", "Reservation", "Preempting", "Priority", "NodeUnhealthy"}
)


class Grower(Protocol):
    def grow(self, ctx: Ctx, pending: Sequence[PendingReason]) -> list[Resize]: ...


class ElasticGrower:
    def grow(self, ctx: Ctx, pending: Sequence[PendingReason]) -> list[Resize]:
        # a job its quota refuses does not wait for GPUs it could not take, whatever its reason names
        if any(r.code in _WAITS_FOR_GPUS and r.job_id not in ctx.quota_blocked for r in pending):
            return []
        out: list[Resize] = []
        cl = ctx.cluster
        elastic = [
            j
            for j in cl.elastic.values()
            if j.max_gpus is not None and j.gpus < j.max_gpus and j.id not in ctx.preempted
        ]
        elastic.sort(key=lambda j: (-ctx.prio_of(j), j.id))
        for j in elastic:
            assert j.max_gpus is not None
            gpt = j.gpus_per_task or max(1, j.gpus // max(1, len(j.placements)))
            step = j.gpu_step or gpt
            if step % gpt:
                continue
            t = cl.job_gpu_type(j)
            added: list[TaskPlacement] = []
            cur = j.gpus
            while cur + step <= j.max_gpus:
                if ctx.quota.check(ctx.ws, j.queue_name, t, step * GPU_MILLI) is not None:
                    break
                plan = ctx.place(step // gpt, gpt, t, None)
                if plan is None:
                    break
                for o, m in plan.tasks:
                    ctx.ws.take(o, m)
                ctx.ws.add_usage(j.queue_name, t, step * GPU_MILLI)
                for o, m in plan.tasks:
                    added.append(
                        TaskPlacement(
                            task=len(j.placements) + len(added), node_id=ctx.idx.ids[o], gpus=bits(m)
                        )
                    )
                cur += step
            if added:
                out.append(Resize(job_id=j.id, gpus=cur, add=tuple(added), reason="grow into idle GPUs"))
        return out
