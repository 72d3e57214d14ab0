"""Preemption service: picks victims (filled in by the scheduling-core integration)."""
