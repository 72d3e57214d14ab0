"""The job controller shell: carry out what ``rallypoint.control.reconcile`` says each job needs.

Talks to node agents by request/reply (commands are not facts) and appends the outcomes to the log.
Several controllers can run side by side, each owning a stable shard of the jobs (``--shard i/n``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from rallypoint.control import Action, Append, Kill, Launch, owned_by, reconcile
from rallypoint.eventlog import EventLog, EventLogError
from rallypoint.events import Event, subjects
from rallypoint.protocol import KillReply, KillTask, LaunchReply, LaunchTask
from rallypoint.runtime.follower import Follower

_log = logging.getLogger("rallypoint.job_controller")

SOURCE = "rallypoint/job-controller"


class JobController:
    def __init__(
        self,
        nc: Client,
        log: EventLog,
        follower: Follower,
        *,
        shard: int = 0,
        shards: int = 1,
        clock: Callable[[], float] = time.time,
        command_timeout: float = 5.0,
        tick_s: float = 1.0,
        preemption_grace_s: float = 30.0,
    ) -> None:
        self.nc = nc
        self.log = log
        self.follower = follower
        self.shard = shard
        self.shards = shards
        self.clock = clock
        self.command_timeout = command_timeout
        self.tick_s = tick_s
        self.preemption_grace_s = preemption_grace_s
        self._inflight: dict[str, asyncio.Task[None]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.follower.changed.clear()
            self.reconcile_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.follower.changed.wait(), self.tick_s)
        for task in list(self._inflight.values()):
            task.cancel()

    def reconcile_all(self) -> None:
        state = self.follower.state
        now = self.clock()
        for job in list(state.jobs.values()):
            if job.terminal or job.job_id in self._inflight:
                continue
            if not owned_by(job.job_id, self.shard, self.shards):
                continue
            actions = reconcile(job, state, now, preemption_grace_s=self.preemption_grace_s)
            if actions:
                task = asyncio.create_task(self._execute(job.job_id, actions))
                self._inflight[job.job_id] = task
                task.add_done_callback(self._forget(job.job_id))

    def _forget(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._inflight.pop(job_id, None)

        return done

    async def _execute(self, job_id: str, actions: list[Action]) -> None:
        try:
            for action in actions:
                if isinstance(action, Launch):
                    if await self._launch(action):
                        await self._append(job_id, action.then)
                elif isinstance(action, Kill):
                    await self._kill(action)
                    if action.await_exits:
                        await self._until_ranks_exited(job_id, action.attempt, action.grace_s + 10.0)
                    if action.then is not None:
                        await self._append(job_id, action.then)
                elif isinstance(action, Append):
                    await self._append(job_id, action.event)
        except EventLogError as exc:
            # Level-triggered: the next pass reconciles the job again.
            _log.warning("job %s: %s; will retry", job_id, exc)
        except Exception:
            _log.exception("job %s: unexpected error; will retry", job_id)

    async def _until_ranks_exited(self, job_id: str, attempt: int, timeout: float) -> None:
        """Wait for every rank's RankExited; past ``timeout`` the ranks are presumed gone (lost node)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            job = self.follower.state.jobs[job_id]
            if job.attempt != attempt or job.terminal or len(job.ranks_exited) >= job.world_size:
                return
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                _log.warning(
                    "job %s attempt %d: ranks did not all report an exit; proceeding", job_id, attempt
                )
                return
            await self.follower.next_change(min(remaining, 1.0))

    async def _append(self, job_id: str, event: Event) -> None:
        job = self.follower.state.jobs[job_id]
        seq = await self.log.append(
            subjects.job(job_id),
            event,
            source=SOURCE,
            msg_id=f"{job_id}:{job.attempt}:{type(event).__name__}",
        )
        await self.follower.wait_for(seq)

    async def _request(self, subject: str, payload: msgspec.Struct) -> bytes | None:
        try:
            reply = await self.nc.request(subject, msgspec.json.encode(payload), timeout=self.command_timeout)
        except (NatsTimeout, NoRespondersError, TimeoutError):
            return None
        return reply.data

    async def _launch(self, action: Launch) -> bool:
        """True when every task's agent confirmed its ranks run (or already ran)."""

        async def one(task: LaunchTask) -> bool:
            data = await self._request(subjects.agent_command(task.node_id, "launch"), task)
            if data is None:
                _log.warning("launch of %s on %s not answered; will retry", task.job_id, task.node_id)
                return False
            reply = msgspec.json.decode(data, type=LaunchReply)
            if not reply.ok:
                _log.warning("launch of %s on %s refused: %s", task.job_id, task.node_id, reply.error)
            return reply.ok

        results = await asyncio.gather(*(one(t) for t in action.tasks))
        return all(results)

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

        await asyncio.gather(*(one(n) for n in action.node_ids))
