"""Audits over the event log: recompute recorded decisions and check them."""

from .verify import AuditReport, Mismatch, verify_decisions

__all__ = ["AuditReport", "Mismatch", "verify_decisions"]
