"""Fork a running simulation: the state at the current instant, run forward on its own.

What the predictor needs (rallypoint.predict): a copy that knows only what a live cluster knows at that
instant. Arrivals and failures still to come are dropped from the copy's events (nobody knows them yet),
as are the fail-slow episodes not yet begun; what is under way stays (repairs, checkpoints, episodes
that started). A job's runtime in the copy is what the caller says it is (:func:`set_runtime`), its
progress so far kept. The copy shares nothing mutable with the original, which goes on unchanged.
"""

from __future__ import annotations

import copy
import heapq
import random
from collections import Counter
from typing import Any

import msgspec

from rallypoint.core.cluster import ClusterModel

from .engine import END, FAIL, SLOW_START, SUBMIT, Simulator
from .holds import ArrayLimits, Holds
from .metrics import Recorder

__all__ = ["fork", "progress", "set_runtime"]

_UNKNOWN_YET = (SUBMIT, FAIL, SLOW_START)


class _Unrecorded(Recorder):
    """A fork measures nothing: its caller reads its jobs' starts, and integrating the cluster's state at
    every instant would cost a tenth of its run."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None


def fork(sim: Simulator) -> Simulator:
    """A copy of ``sim`` between two instants that holds only its running and pending jobs."""
    f = copy.copy(sim)
    f.model = _copy_model(sim)
    f.running = {jid: copy.copy(sj) for jid, sj in sim.running.items()}
    f.pending = {jid: copy.copy(sj) for jid, sj in sim.pending.items()}
    f.jobs = {**f.running, **f.pending}
    f.heap = [e for e in sim.heap if e[1] not in _UNKNOWN_YET]
    heapq.heapify(f.heap)
    f.unsubmitted = 0
    f.records = []
    f.rejected = []
    f.holds = Holds(f._placed)  # its own: a fork holds no job, and its ends must not reach the original's
    f.has_holds = False
    f.limits = ArrayLimits(())  # a fork holds no member past its array's limit: its members all run forward
    f.arrived = set(f.jobs)
    f.cycles = 0
    f.bind_conflicts = 0
    f.on_node = {n: set(ids) for n, ids in sim.on_node.items()}
    f.down = set(sim.down)
    f.team_alloc = Counter(sim.team_alloc)
    f.team_pending_sizes = {t: Counter(c) for t, c in sim.team_pending_sizes.items()}
    # a repaired node draws its next failure from the generator: a copy would know the real one, and a
    # shared one would change it; a fork draws none
    f.rng = random.Random(0)
    f.cluster = msgspec.structs.replace(
        sim.cluster, faults=msgspec.structs.replace(sim.cluster.faults, node_mtbf=None)
    )
    f.rec = _Unrecorded(total_gpus=sim.rec.total_gpus, nominal=sim.rec.nominal, horizon=sim.rec.horizon)
    f.node_slow = {n: dict(active) for n, active in sim.node_slow.items()}
    f.episodes = dict(sim.episodes)
    f._episode_feed = {}  # generators cannot be copied, and the episodes to come are unknown anyway
    f.cordoned = set(sim.cordoned)
    f.cordon_until = dict(sim.cordon_until)
    f.fs_counts = Counter(sim.fs_counts)
    return f


def _copy_model(sim: Simulator) -> ClusterModel:
    """A deep copy of the cluster model that shares its frozen nodes and running jobs (they are replaced,
    never changed): copying them was most of a fork's copy time."""
    frozen: dict[int, Any] = {id(n): n for n in sim.model.nodes.values()}
    frozen.update((id(rj), rj) for rj in sim.model.running.values())
    return copy.deepcopy(sim.model, frozen)


def progress(sim: Simulator, job_id: str, now: float) -> float:
    """Seconds of work (at the job's full size) that a running or pending job has done by ``now``."""
    sj = sim.jobs[job_id]
    if job_id in sim.running:
        return min(sj.job.duration, sj.progress0 + max(0.0, now - sj.run_start) * sj.rate)
    return sj.job.duration - sj.remaining


def set_runtime(sim: Simulator, job_id: str, runtime_s: float, now: float) -> None:
    """Make a running or pending job of a fork ``runtime_s`` seconds long in all (at its full size), the
    work it has done kept; a running job past that ends at ``now``."""
    sj = sim.jobs[job_id]
    done = progress(sim, job_id, now)
    runtime_s = max(runtime_s, done)
    sj.job = msgspec.structs.replace(sj.job, duration=runtime_s)
    if job_id in sim.pending:
        sj.remaining = max(runtime_s - done, 0.0)
        return
    sj.attempt += 1  # the END pushed for the old runtime is stale from now on
    end = sj.run_start + (runtime_s - sj.progress0) / sj.rate
    sim._push(max(end, now), END, job_id, sj.attempt)
