"""The job controller shell: carry out what ``rallypoint.control.reconcile`` says each job needs.

Talks to node agents by request/reply (commands are not facts) and appends the outcomes to the log.
Several controllers can run side by side: the jobs (and, for the sweeps, the nodes) fall into a fixed
number of partitions (``subjects.CONTROL_PARTITIONS``) that the live replicas share (``runtime.partitions``);
a replica acts only on the partitions it owns now, and every append it makes is fenced by its ownership
epoch, so a deposed owner's write is refused by the server and it drops the partition at once.

Each pass reconciles only the jobs whose answer may have changed since the last one (reconciling every
job on every event was nearly all of its CPU at 20k jobs): those the follower's change feed names, those
holding GPUs on a node it names, those whose actions just ended (level-triggered: an unanswered launch is
tried again), and those whose time limit came (``wake_at``). A full pass runs at start and after a
snapshot restore, and every ``full_sweep_s`` as a safety net.

A job's secrets (``eventlog.secretstore``) are read for each launch and sent inside its requests alone;
a job that has ended has its secrets purged. Neither their values nor anything derived from them is
logged, counted or traced here.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from rallypoint.control import (
    Action,
    Append,
    Kill,
    Launch,
    LaunchRefusal,
    RecoveryConfig,
    reconcile,
    refusal_event,
    stale_attempts,
    wake_at,
    with_lost_work,
)
from rallypoint.control.recovery import secrets_lost_event
from rallypoint.eventlog import EventLog, EventLogError
from rallypoint.eventlog.secretstore import SecretStore
from rallypoint.events import Event, subjects
from rallypoint.observability import tracing
from rallypoint.observability.instruments import JOB_CONTROLLER_ACTIONS
from rallypoint.observability.tracing import span, trace_headers
from rallypoint.protocol import KillReply, KillTask, LaunchReply, LaunchTask, StatusReply
from rallypoint.runtime.follower import Changes, Follower
from rallypoint.runtime.partitions import PartitionOwnership
from rallypoint.state import ClusterState, JobView

_log = logging.getLogger("rallypoint.job_controller")

SOURCE = "rallypoint/job-controller"

T = TypeVar("T")

#: Jobs whose commands or appends may be on the wire at once. A burst of binds (19,000 in a minute) would
#: otherwise start as many launches and appends together: past the connection's outbound buffer every
#: request fails at once (OutboundBufferLimitError), the agents' replies time out behind the queue, and
#: every failure is tried again on the next pass (300k warnings in one 19k burst). Queued here instead,
#: they go out as fast as the agents and the log answer. Waits for ranks to exit hold no slot.
MAX_ACTIVE_JOBS = 256
#: jobs a reconcile pass looks at between two yields to the event loop (``reconcile_jobs``)
RECONCILE_CHUNK = 256

# The counter's child per action kind, looked up once: ``labels()`` costs a lock and a dict build per call.
_ACTIONS_COUNTED = {
    kind: JOB_CONTROLLER_ACTIONS.labels(action=kind.__name__.lower()) for kind in (Launch, Kill, Append)
}


async def _all(calls: list[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` of ``calls``; one call (a one-node gang, most jobs) is awaited as it is, without
    the task and the gathering future gather would wrap it in."""
    if len(calls) == 1:
        return [await calls[0]]
    return list(await asyncio.gather(*calls))


def _with_secrets(action: Launch, secrets: dict[str, str]) -> Launch:
    """``action`` whose every task carries the job's secrets: made for the requests of one launch and
    dropped after it, never kept, logged or appended."""
    if not secrets:
        return action
    tasks = tuple(msgspec.structs.replace(task, secrets=secrets) for task in action.tasks)
    return msgspec.structs.replace(action, tasks=tasks)


class JobController:
    def __init__(
        self,
        nc: Client,
        log: EventLog,
        follower: Follower,
        *,
        partitions: PartitionOwnership | None = None,
        clock: Callable[[], float] = time.time,
        command_timeout: float = 5.0,
        tick_s: float = 1.0,
        preemption_grace_s: float = 30.0,
        recovery: RecoveryConfig | None = None,
        full_sweep_s: float = 60.0,
        max_active_jobs: int = MAX_ACTIVE_JOBS,
    ) -> None:
        self.nc = nc
        self.log = log
        self.follower = follower
        # None: this controller owns every job and appends unfenced (one controller in tests and benches)
        self.partitions = partitions
        self._generation = -1  # the ownership generation the last pass saw
        self._changed = follower.change_signal()  # its own: the fold may be shared (runtime.cohost)
        if partitions is not None:
            partitions.listeners.append(self._changed.set)  # a gain or loss wakes the loop
        self.clock = clock
        self.command_timeout = command_timeout
        self.tick_s = tick_s
        self.preemption_grace_s = preemption_grace_s
        self.recovery = recovery if recovery is not None else RecoveryConfig()
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._node_status: dict[str, str] = {}
        self._sweeps: set[asyncio.Task[None]] = set()
        self.full_sweep_s = full_sweep_s
        self._changes = follower.changes()  # its first take says "everything": the first pass is full
        self._ended: set[str] = set()  # jobs whose actions ended since the last pass
        self._wakeups: list[tuple[float, str]] = []  # (time, job): a time limit to check then
        self._wake_at: dict[str, float] = {}  # the wakeup each job has in the heap
        self._last_full = float("-inf")
        self._wire = asyncio.Semaphore(max_active_jobs)  # see MAX_ACTIVE_JOBS
        self._secret_store: SecretStore | None = None  # opened at the first job with secrets
        self._secrets_forgotten: set[str] = set()  # ended jobs whose secrets this process purged
        self._forgetting: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                self._changed.clear()
                await self.reconcile_changed()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.tick_s)
        finally:
            # stopped or cancelled alike: no launch, kill or append of this controller outlives it (a
            # cancelled run used to leave its in-flight actions writing after the process meant to stop)
            for task in [*self._inflight.values(), *self._sweeps, *self._forgetting]:
                task.cancel()

    async def reconcile_changed(self) -> None:
        """One pass: reconcile what may have changed, and sweep the nodes that came back."""
        changes = self._changes.take()
        now = self.clock()
        if self._ownership_moved():
            changes = Changes(frozenset(), frozenset(), everything=True)
        if changes.everything or now - self._last_full >= self.full_sweep_s:
            self._last_full = now
            await self.reconcile_all()
        else:
            await self.reconcile_jobs(self._due(changes, now))
        self.sweep_recovered_nodes(None if changes.everything else changes.nodes)

    def _owns(self, key: str) -> bool:
        return self.partitions is None or self.partitions.owns(key)

    def _ownership_moved(self) -> bool:
        """True when partitions came or went since the last pass: the actions of jobs no longer ours stop
        (their appends would be refused anyway), and a full pass finds the jobs of the partitions gained."""
        if self.partitions is None or self.partitions.generation == self._generation:
            return False
        self._generation = self.partitions.generation
        for job_id, task in list(self._inflight.items()):
            if not self._owns(job_id):
                task.cancel()
        return True

    async def reconcile_all(self) -> None:
        """Reconcile every job of the partitions owned now (a full pass)."""
        self._ended.clear()
        await self.reconcile_jobs(list(self.follower.state.jobs))

    def _due(self, changes: Changes, now: float) -> set[str]:
        """The jobs whose reconcile may answer differently than at their last one."""
        state = self.follower.state
        due = set(changes.jobs)
        for job_id in changes.jobs:  # a job that started or ended may meet or break its dependents' waits
            due |= state.dependents_of(job_id)
        for node_id in changes.nodes:
            node = state.nodes.get(node_id)
            if node is not None:
                due.update(node.job_ids())  # a node's status change concerns the gangs on it
        due |= self._ended
        self._ended.clear()
        while self._wakeups and self._wakeups[0][0] < now:  # reconcile acts once now > started + limit
            at, job_id = heapq.heappop(self._wakeups)
            if self._wake_at.get(job_id) == at:
                del self._wake_at[job_id]
                due.add(job_id)
        return due

    async def reconcile_jobs(self, job_ids: Iterable[str]) -> None:
        """Reconcile these jobs (in arrival order, as a full pass does) and start their actions.

        A full pass over a large cluster's jobs (every job ever submitted, 12,000 and more) is a second of
        CPU on a busy core: it gives the loop back every ``RECONCILE_CHUNK`` jobs, or the partition leases
        this replica renews every 0.4 s expired under it, and the pass their loss starts (``everything``)
        stalled the loop again (seen in ``rally bench cluster --nodes 12500``: every lease lost twice in
        five seconds). Each job is looked at as the fold has it when its turn comes."""
        state = self.follower.state
        now = self.clock()
        jobs = [job for job_id in job_ids if (job := state.jobs.get(job_id)) is not None]
        jobs.sort(key=lambda j: j.submitted_seq)
        for i, job in enumerate(jobs):
            if i % RECONCILE_CHUNK == RECONCILE_CHUNK - 1:
                await asyncio.sleep(0)
            if job.terminal:
                self._forget_secrets(job)
                continue
            if job.job_id in self._inflight:
                continue  # in flight: looked at again when its actions end
            if not self._owns(job.job_id):
                continue
            self._reconcile_one(state, job.job_id, now)

    def _reconcile_one(self, state: ClusterState, job_id: str, now: float) -> None:
        job = state.jobs[job_id]
        actions = reconcile(
            job, state, now, preemption_grace_s=self.preemption_grace_s, recovery=self.recovery
        )
        if actions:
            task = asyncio.create_task(self._execute(job_id, actions))
            self._inflight[job_id] = task
            task.add_done_callback(self._forget(job_id))
            return
        at = wake_at(job, state, self.recovery)
        # a time already past found nothing to do now: only a later event can change that
        if at is not None and at > now and self._wake_at.get(job_id) != at:
            self._wake_at[job_id] = at
            heapq.heappush(self._wakeups, (at, job_id))

    def _forget(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._inflight.pop(job_id, None)
            # Level-triggered: whatever the actions did (or failed to), the next pass looks again.
            self._ended.add(job_id)

        return done

    async def _execute(self, job_id: str, actions: list[Action]) -> None:
        try:
            for action in actions:
                _ACTIONS_COUNTED[type(action)].inc()
                if isinstance(action, Launch):
                    async with self._wire:
                        await self._launch_then(job_id, action)
                elif isinstance(action, Kill):
                    async with self._wire:
                        await self._kill(action)
                    if action.await_ranks:
                        await self._until_ranks_exited(
                            job_id, action.attempt, action.await_ranks, action.grace_s + 10.0
                        )
                    if action.then is not None:
                        job = self.follower.state.jobs[job_id]
                        async with self._wire:
                            await self._append(job_id, with_lost_work(action.then, job, self.clock()))
                elif isinstance(action, Append):
                    async with self._wire:
                        await self._append(job_id, action.event)
        except EventLogError as exc:
            # Level-triggered: the next pass reconciles the job again.
            _log.warning("job %s: %s; will retry", job_id, exc)
        except Exception:
            _log.exception("job %s: unexpected error; will retry", job_id)

    async def _launch_then(self, job_id: str, action: Launch) -> None:
        """Launch the gang's ranks, then append what the launch leads to (or the agents' refusals). A job
        whose secrets are gone fails instead: it would run without what it was given."""
        with self._launch_span(job_id):
            secrets = await self._secrets_of(job_id)
            if secrets is None:
                job = self.follower.state.jobs[job_id]
                missing = job.spec.secret_names
                _log.warning("job %s: its secrets %s are gone; failing it", job_id, ", ".join(missing))
                await self._append(job_id, secrets_lost_event(job, missing, self.clock()))
                return
            refusals = await self._launch(_with_secrets(action, secrets))
            if refusals is None:
                await self._append(job_id, action.then)
            else:
                await self._refused(job_id, action, refusals)

    def _launch_span(self, job_id: str) -> contextlib.AbstractContextManager[object]:
        """The launch joins the job's trace; its requests carry the context on to the agents. Without a
        tracer, nothing: not even the no-op span and the lookup of the job's trace."""
        if not tracing.enabled():
            return contextlib.nullcontext()
        parent = self.follower.traces.context(job_id)
        return span("launch", parent, attributes={"rally.job_id": job_id})

    async def _until_ranks_exited(
        self, job_id: str, attempt: int, ranks: tuple[int, ...], timeout: float
    ) -> None:
        """Wait for these ranks' RankExited; past ``timeout`` they are presumed gone (a lost node)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            job = self.follower.state.jobs[job_id]
            if job.attempt != attempt or job.terminal or all(r in job.ranks_exited for r in ranks):
                return
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                _log.warning(
                    "job %s attempt %d: ranks did not all report an exit; proceeding", job_id, attempt
                )
                return
            await self.follower.next_change(min(remaining, 1.0))

    async def _append(self, job_id: str, event: Event) -> None:
        """Append for ``job_id``, fenced by the epoch of its partition's ownership: ``NotOwner`` when this
        replica does not own it now; ``AppendConflict`` (and the partition dropped) when a newer one does."""
        job = self.follower.state.jobs[job_id]
        subject = subjects.for_event(event)
        msg_id = f"{job_id}:{job.attempt}:{type(event).__name__}"
        if self.partitions is None:
            seq = await self.log.append(subject, event, source=SOURCE, msg_id=msg_id)
        else:
            seq = await self.partitions.append(job_id, subject, event, msg_id)
        await self.follower.wait_for(seq)

    async def _request(self, subject: str, payload: msgspec.Struct) -> bytes | None:
        try:
            data = msgspec.json.encode(payload)
            headers = trace_headers() or None
            reply = await self.nc.request(subject, data, timeout=self.command_timeout, headers=headers)
        except (NatsTimeout, NoRespondersError, TimeoutError):
            return None
        return reply.data

    async def _launch(self, action: Launch) -> list[LaunchRefusal] | None:
        """None when every task's agent confirmed its ranks run (or already ran); else the refusals the
        agents answered (empty when some agent only did not answer: the next pass tries again)."""

        async def one(task: LaunchTask) -> LaunchRefusal | bool:
            data = await self._request(subjects.agent_command(task.node_id, "launch"), task)
            if data is None:
                _log.warning("launch of %s on %s not answered; will retry", task.job_id, task.node_id)
                return False
            reply = msgspec.json.decode(data, type=LaunchReply)
            if reply.ok:
                return True
            _log.warning("launch of %s on %s refused: %s", task.job_id, task.node_id, reply.error)
            return LaunchRefusal(node_id=task.node_id, code=reply.code, error=reply.error)

        results = await _all([one(t) for t in action.tasks])
        if all(r is True for r in results):
            return None
        return [r for r in results if isinstance(r, LaunchRefusal)]

    # -- secrets ---------------------------------------------------------------------------------------

    async def _secrets(self) -> SecretStore:
        if self._secret_store is None:
            self._secret_store = await SecretStore.open(self.log.js)
        return self._secret_store

    async def _secrets_of(self, job_id: str) -> dict[str, str] | None:
        """The values of the job's secrets for its launch ({} when it has none), or None when any of them
        is not in the store. A store that does not answer raises: the next pass tries again."""
        job = self.follower.state.jobs.get(job_id)
        names = job.spec.secret_names if job is not None else ()
        if not names:
            return {}
        stored = await (await self._secrets()).read(job_id)
        if stored is None or any(name not in stored for name in names):
            return None
        return {name: stored[name] for name in names}

    def _forget_secrets(self, job: JobView) -> None:
        """Purge an ended job's secrets (once per process; a failed purge is tried again next pass)."""
        job_id = job.job_id
        if not job.spec.secret_names or job_id in self._secrets_forgotten:
            return
        if not self._owns(job_id):
            return
        self._secrets_forgotten.add(job_id)
        task = asyncio.create_task(self._purge_secrets(job_id))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _purge_secrets(self, job_id: str) -> None:
        try:
            async with self._wire:
                if await (await self._secrets()).forget(job_id):
                    _log.info("job %s has ended: its secrets are purged", job_id)
        except Exception as exc:
            self._secrets_forgotten.discard(job_id)
            _log.warning("job %s: purging its secrets failed (%s); will retry", job_id, type(exc).__name__)

    async def _refused(self, job_id: str, action: Launch, refusals: list[LaunchRefusal]) -> None:
        """Record a refused launch as ``refusal_event`` decides (None: retried by the next pass). The
        tasks other agents did start are stopped first: the attempt is over."""
        job = self.follower.state.jobs[job_id]
        event = refusal_event(job, refusals, self.clock(), self.recovery)
        if event is None:
            return
        nodes = tuple(sorted({t.node_id for t in action.tasks}))
        await self._kill(Kill(job_id=job_id, attempt=job.attempt, node_ids=nodes, then=None))
        await self._append(job_id, event)

    async def _kill(self, action: Kill) -> None:
        """Best effort per node: an unreachable node's ranks are as good as dead to the gang."""

        async def one(node_id: str) -> None:
            command = KillTask(job_id=action.job_id, attempt=action.attempt, grace_s=action.grace_s)
            data = await self._request(subjects.agent_command(node_id, "kill"), command)
            if data is None:
                _log.warning("kill of %s on %s not answered", action.job_id, node_id)
                return
            reply = msgspec.json.decode(data, type=KillReply)
            if not reply.ok:
                _log.warning("kill of %s on %s failed: %s", action.job_id, node_id, reply.error)

        if action.node_ids:
            await _all([one(n) for n in action.node_ids])

    # -- nodes that answer again ------------------------------------------------------------------

    def sweep_recovered_nodes(self, node_ids: Iterable[str] | None = None) -> None:
        """Kill the ranks a node that came back still runs for attempts the log has moved on from. Looks
        at ``node_ids`` (the nodes events touched since the last pass), or at every node when None."""
        nodes = self.follower.state.nodes
        for node_id in nodes if node_ids is None else node_ids:
            node = nodes.get(node_id)
            if node is None:
                continue
            before = self._node_status.get(node_id)
            self._node_status[node_id] = node.status
            if before is None or before == "up" or node.status != "up":
                continue
            if not self._owns(node_id):  # nodes fall into the same partitions by their id
                continue
            task = asyncio.create_task(self._sweep(node_id))
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

    async def _sweep(self, node_id: str) -> None:
        data = await self._request(
            subjects.agent_command(node_id, "status"), StatusReply(node_id=node_id, agent_instance="")
        )
        if data is None:
            _log.warning("node %s is back but did not answer a status request", node_id)
            return
        reply = msgspec.json.decode(data, type=StatusReply)
        for job_id, attempt in stale_attempts(self.follower.state, node_id, reply.ranks):
            _log.warning("node %s is back and still runs %s attempt %d: killing it", node_id, job_id, attempt)
            await self._kill(Kill(job_id=job_id, attempt=attempt, node_ids=(node_id,), then=None))
