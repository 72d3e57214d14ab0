"""Audits over the event log: recompute recorded decisions and check them."""

from .settings import Overrides, SettingsSpan
from .verify import AuditReport, Mismatch, Tally, verify_decisions
from .writers import Trespass, WriterCheck

__all__ = [
    "AuditReport",
    "Mismatch",
    "Overrides",
    "SettingsSpan",
    "Tally",
    "Trespass",
    "WriterCheck",
    "verify_decisions",
]
