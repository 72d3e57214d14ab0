"""Predictor service: every waiting job's predicted start, from the live fold run forward."""
