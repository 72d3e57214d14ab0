"""Rallypoint: gang scheduling for distributed training on shared GPU clusters, over an event log."""

__version__ = "0.1.0"
