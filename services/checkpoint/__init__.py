"""Checkpoint service: verification and retention of the jobs' sharded checkpoints."""
