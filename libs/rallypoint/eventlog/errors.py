"""Errors of the event log; callers branch on these, never on nats-py exceptions."""

from __future__ import annotations

# JetStream API error codes for a failed conditional append.
WRONG_LAST_SEQUENCE = 10071  # Nats-Expected-Last-Subject-Sequence did not match
CONCURRENT_WRITE = 10164  # another write to the same subject was in flight (clustered/concurrent)
CONFLICT_CODES = frozenset({WRONG_LAST_SEQUENCE, CONCURRENT_WRITE})
# An atomic batch holding a Nats-Msg-Id the stream already stores is refused whole (checked on 2.15.1
# before the expected sequences): a retry of a batch that landed, or a writer deciding on a stale fold.
DUPLICATE_IN_BATCH = 10201
BATCH_CONFLICT_CODES = CONFLICT_CODES | {DUPLICATE_IN_BATCH}
# "atomic publish batch is too large: N" (2.15.1): more messages than the server's
# jetstream.limits.batch.max_msgs; nothing of the batch is stored.
BATCH_TOO_LARGE = 10199


class EventLogError(Exception):
    """Base of every event-log error."""


class AppendConflict(EventLogError):
    """A conditional append lost: somebody else wrote to the guarded subject (tree) first."""

    def __init__(self, code: int, description: str = "") -> None:
        super().__init__(f"append conflict {code}: {description}")
        self.code = code
        self.description = description


class LogUnavailable(EventLogError):
    """The log did not answer (no responders, timeout, connection closed): map to HTTP 503.

    After a timeout the append may still have landed: retry with the same ``msg_id`` (within the
    stream's 2-minute duplicate window) to find out without writing twice.
    """


class BatchTooLarge(EventLogError):
    """The server takes at most ``limit`` messages in an atomic batch; nothing of this one was stored."""

    def __init__(self, limit: int, size: int) -> None:
        super().__init__(f"the server takes atomic batches of at most {limit} events, not {size}")
        self.limit = limit
        self.size = size


class LogGap(EventLogError):
    """A replay ended short of its target or saw sequences that were not increasing."""


class UndecodableEvent(EventLogError):
    """A stored message is not a known event (unknown type or invalid body)."""

    def __init__(self, seq: int, subject: str, reason: str) -> None:
        super().__init__(f"cannot decode event at seq {seq} on {subject}: {reason}")
        self.seq = seq
        self.subject = subject
        self.reason = reason
