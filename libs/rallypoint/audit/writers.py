"""Who wrote each fact: every event must come from its one writer, on that writer's subject, and follow
that writer's rules.

The NATS permissions (``rallypoint.security.permissions``) give each subject one writer and
``events.subjects.for_event`` gives each event one subject, so an event stored anywhere else was written
by an identity that had no right to it: the codec quarantines it as ``misplaced`` and no fold applies it.
The audit fails on each one and names it. Two facts can be on the right subject and still not belong:

- a ``RankExited`` for a rank its attempt does not run on that node: a node agent speaking for ranks it
  never launched (the fold counts it in ``foreign_exits`` and applies nothing);
- a silence verdict the health monitor's rules never give (``health.liveness``): a node is lost only after
  its heartbeat was lost (``NodeHeartbeatLost``, then ``NodeLost``), and recovers only from such a silence;
  and the monitor drains a node through its health verdict (``NodeHealthChanged`` failed), never with a
  ``NodeDrained`` of its own.

A re-registration that changed a node's hardware is held by the fold until an operator undrains the node;
the audit lists those, it does not fail on them. Pure: the caller feeds the events in log order, each
before the fold applies it.
"""

from __future__ import annotations

import msgspec

from rallypoint.events import Event, NodeDrained, NodeHeartbeatLost, NodeLost, NodeRecovered, RankExited
from rallypoint.events.codec import Quarantined, event_type
from rallypoint.events.subjects import HEALTH_MONITOR
from rallypoint.state import LAUNCHED, ClusterState, launched_on


class Trespass(msgspec.Struct, frozen=True, kw_only=True):
    """An event that its writer had no right to, or that its writer's rules never give."""

    seq: int
    event_type: str
    subject: str  # where it was stored ("" when the history does not say)
    why: str

    def describe(self) -> str:
        where = f" on {self.subject}" if self.subject else ""
        return f"seq {self.seq} {self.event_type}{where}: {self.why}"


class WriterCheck:
    """Follows the log beside a fold and names every event that does not belong."""

    def __init__(self) -> None:
        self.trespasses: list[Trespass] = []
        # Nodes whose heartbeat the monitor declared lost and that have not recovered since.
        self._silent: set[str] = set()

    def misplaced(self, seq: int, item: Quarantined) -> None:
        if item.reason == "misplaced":
            why = f"written by an identity without the right to it ({item.error})"
            self.trespasses.append(
                Trespass(seq=seq, event_type=item.event_type, subject=item.subject, why=why)
            )

    def before_apply(self, state: ClusterState, seq: int, event: Event) -> None:
        """Judge ``event`` against the state the fold had just before it."""
        why = self._why_foreign(state, event) if isinstance(event, RankExited) else self._why_verdict(event)
        if why:
            self.trespasses.append(Trespass(seq=seq, event_type=event_type(event), subject="", why=why))

    @staticmethod
    def _why_foreign(state: ClusterState, e: RankExited) -> str:
        job = state.jobs.get(e.job_id)
        if job is None or job.state not in LAUNCHED or job.attempt != e.attempt:
            return ""  # a late report of an attempt that has moved on: the fold ignores it, as it should
        if launched_on(job, e.node_id, e.rank):
            return ""
        return f"node {e.node_id} does not run rank {e.rank} of {e.job_id} attempt {e.attempt}"

    def _why_verdict(self, event: Event) -> str:
        if isinstance(event, NodeHeartbeatLost):
            self._silent.add(event.node_id)
        elif isinstance(event, NodeLost | NodeRecovered):
            if event.node_id not in self._silent:
                verdict = "lost" if isinstance(event, NodeLost) else "recovered"
                return f"node {event.node_id} {verdict} without its heartbeat lost first"
            if isinstance(event, NodeRecovered):
                self._silent.discard(event.node_id)
        elif isinstance(event, NodeDrained) and event.drained_by == HEALTH_MONITOR:
            return (
                f"the health monitor drains through NodeHealthChanged, never a NodeDrained ({event.node_id})"
            )
        return ""
