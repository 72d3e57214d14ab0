"""The one shape of what the scheduler appends (shared by the bridge, repairs and pending reasons)."""

from __future__ import annotations

import msgspec

from rallypoint.events import Event


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """One append the scheduler must make: on the fenced ``rally.sched.>`` tree (admissions beside it)."""

    subject: str
    event: Event
    msg_id: str
