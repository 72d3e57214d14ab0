"""Jobs held by their dependencies or their name, in the simulator as the live fold holds them.

The rule is the fold's (``state.dependencies.kind_status``): ``after`` is met once the job waited for was
placed, ``after-ok`` once it completed, ``after-not-ok`` once it ended any other way, ``after-any`` once it
ended; a singleton waits for every earlier live job of its team and name. A held job does not reach the
core; one whose dependency can no longer be met ends as ``failed`` (live: the job controller's
``JobFailed``), which may in turn break the dependencies of others.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable

from rallypoint.state.dependencies import kind_status

from .workload import Job

__all__ = ["ArrayLimits", "Holds"]


class Holds:
    """Held jobs by id, how each ended job ended, and the live jobs of each (team, name) by arrival."""

    def __init__(self, placed: Callable[[str], bool]) -> None:
        self._placed = placed  # whether a job's first attempt was given its GPUs
        self.held: dict[str, tuple[int, Job]] = {}
        self.ended: dict[str, str] = {}  # job id -> completed, rejected or failed
        self.failed: list[str] = []  # ended because a dependency could no longer be met, in order
        self._named: dict[tuple[str, str], dict[str, int]] = {}

    def arrive(self, job: Job, seq: int) -> bool:
        """``job`` arrived: True when it is held (it must not be queued yet)."""
        self._named.setdefault((job.team, job.job_name), {})[job.id] = seq
        if job.depends_on or job.singleton:
            self.held[job.id] = (seq, job)
            return True
        return False

    def end(self, job: Job, outcome: str) -> None:
        """``job`` ended (``completed`` or ``rejected``)."""
        self.ended[job.id] = outcome
        named = self._named.get((job.team, job.job_name), {})
        named.pop(job.id, None)

    def release(self) -> list[str]:
        """End the held jobs that can never start, until none more can, then return (in arrival order)
        those now free to be queued; they leave the held set."""
        while self._fail_impossible():
            pass
        in_order = sorted(self.held, key=lambda job_id: self.held[job_id][0])
        free = [job_id for job_id in in_order if self._free(job_id)]
        for job_id in free:
            del self.held[job_id]
        return free

    def _fail_impossible(self) -> bool:
        doomed = [
            (seq, job)
            for seq, job in self.held.values()
            if any(self._status(d.kind, d.job_id) == "never" for d in job.depends_on)
        ]
        for _seq, job in sorted(doomed, key=lambda sj: sj[0]):
            del self.held[job.id]
            self.end(job, "failed")
            self.failed.append(job.id)
        return bool(doomed)

    def _free(self, job_id: str) -> bool:
        seq, job = self.held[job_id]
        if any(self._status(d.kind, d.job_id) != "met" for d in job.depends_on):
            return False
        if job.singleton:
            named = self._named.get((job.team, job.job_name), {})
            return not any(other_seq < seq for other_seq in named.values())
        return True

    def _status(self, kind: str, job_id: str) -> str:
        return kind_status(kind, placed=self._placed(job_id), ended=self.ended.get(job_id))


class ArrayLimits:
    """The members of throttled arrays past their limit, held as the fold holds them (``throttle_holds``):
    at every core call, of each array's arrived, unended members that are waiting (queued, or held here),
    the first ``limit - running`` by index may be queued and the rest are held, so a member preempted back
    into the queue may be held again when a lower index is waiting, as it is live."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.arrays: dict[str, list[Job]] = {}
        for job in jobs:
            if job.array is not None and job.array.max_running is not None:
                self.arrays.setdefault(job.array.array_id, []).append(job)
        for members in self.arrays.values():
            members.sort(key=lambda j: j.array.index if j.array is not None else 0)
        self.held: set[str] = set()

    def rebalance(
        self,
        *,
        arrived: Container[str],
        ended: Container[str],
        queued: Container[str],
        running: Container[str],
    ) -> tuple[list[str], list[str]]:
        """(members to queue, members to take out of the queue and hold), in index order."""
        to_queue: list[str] = []
        to_hold: list[str] = []
        for members in self.arrays.values():
            limit = members[0].array.max_running if members[0].array is not None else None
            assert limit is not None
            live = [j.id for j in members if j.id in arrived and j.id not in ended]
            budget = max(0, limit - sum(1 for i in live if i in running))
            waiting = [i for i in live if i in queued or i in self.held]
            for k, job_id in enumerate(waiting):
                if k < budget and job_id in self.held:
                    self.held.discard(job_id)
                    to_queue.append(job_id)
                elif k >= budget and job_id in queued:
                    self.held.add(job_id)
                    to_hold.append(job_id)
        return to_queue, to_hold
