"""Inventory service: nodes, GPUs and topology."""
