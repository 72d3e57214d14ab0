"""Audits over the event log: recompute recorded decisions and check them."""

from .verify import AuditReport, Mismatch, verify_decisions
from .writers import Trespass, WriterCheck

__all__ = ["AuditReport", "Mismatch", "Trespass", "WriterCheck", "verify_decisions"]
