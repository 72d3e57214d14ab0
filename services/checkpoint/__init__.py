"""Checkpoint service: manifests, verification and GC (filled in by a later issue)."""
