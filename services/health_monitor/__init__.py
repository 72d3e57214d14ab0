"""Health monitor service: heartbeats and GPU faults into node events."""
