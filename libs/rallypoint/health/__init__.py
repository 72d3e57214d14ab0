"""Node health: turning heartbeats and GPU samples into node events. Pure."""

from .liveness import (
    FATAL_XIDS,
    Assessment,
    Decision,
    HealthPolicy,
    Hearing,
    MassSilence,
    assess,
    mass_silence,
    silence_started,
)

__all__ = [
    "FATAL_XIDS",
    "Assessment",
    "Decision",
    "HealthPolicy",
    "Hearing",
    "MassSilence",
    "assess",
    "mass_silence",
    "silence_started",
]
