"""What changed since a consumer last looked: the change feed a ``Follower`` keeps for each consumer.

A service that reacts to the log should look again only at the jobs and nodes an event touched, not
rescan every job on every event (at 20k jobs that rescan was nearly all of the job controller's CPU).
"""

from __future__ import annotations

import msgspec

from rallypoint.state import Touched


class Changes(msgspec.Struct, frozen=True):
    """The job and node ids touched since the last ``take``. ``everything``: the state was replaced (a
    snapshot restored), so the sets say nothing and every job and node must be looked at."""

    jobs: frozenset[str]
    nodes: frozenset[str]
    everything: bool = False

    def __bool__(self) -> bool:
        return self.everything or bool(self.jobs) or bool(self.nodes)


class ChangeSet:
    """One consumer's accumulated changes (``Follower.changes()`` registers one): the follower adds what
    each applied event touched, the consumer takes them (and the set starts empty again)."""

    def __init__(self, *, everything: bool = True) -> None:
        # A new consumer has seen nothing yet: its first take asks it to look at everything.
        self._jobs: set[str] = set()
        self._nodes: set[str] = set()
        self._everything = everything

    def add(self, touched: Touched) -> None:
        if touched.job_id is not None:
            self._jobs.add(touched.job_id)
        if touched.more_jobs:
            self._jobs.update(touched.more_jobs)
        if touched.node_ids:
            self._nodes.update(touched.node_ids)

    def invalidate(self) -> None:
        """The state was replaced: everything must be looked at again."""
        self._everything = True

    def take(self) -> Changes:
        changes = Changes(frozenset(self._jobs), frozenset(self._nodes), self._everything)
        self._jobs.clear()
        self._nodes.clear()
        self._everything = False
        return changes
