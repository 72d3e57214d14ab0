"""Which trace each job belongs to: the ``traceparent`` its ``JobSubmitted`` was appended with.

A follower notes it as it folds (``Follower.traces``); a service acting on a job parents its span on it,
so one trace holds the job from submit to running across processes. Jobs submitted before the snapshot a
service started from have no entry there: their later spans start traces of their own.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context

from rallypoint.events import JobInterrupted, JobSubmitted

from .tracing import context_from, enabled


class JobTraces:
    def __init__(self) -> None:
        self._parents: dict[str, str] = {}
        # job -> when its gang was last interrupted: a recovery span starts there (the fold forgets it
        # as soon as the repair is applied, which may be before the scheduler records the span)
        self.interrupted_at: dict[str, float] = {}

    def note(self, rec: object) -> None:
        """Note what a ``Recorded`` tells (duck-typed: the event log imports this package)."""
        event = getattr(rec, "event", None)
        # Without tracing a parent would only be dropped: leave the submission's headers unparsed, ~9 us
        # of every fold's work per job (``feeds.LazyEnvelope``).
        if isinstance(event, JobSubmitted) and enabled():
            envelope = getattr(rec, "envelope", None)
            parent = envelope.get("traceparent") if isinstance(envelope, Mapping) else None
            if parent:
                self._parents.setdefault(event.job_id, parent)
        elif isinstance(event, JobInterrupted):
            self.interrupted_at[event.job_id] = event.at

    def context(self, job_id: str) -> Context | None:
        return context_from(self._parents.get(job_id))
