"""The JSON object ``rally sim packing --json`` prints: per seed and summarised over seeds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rallypoint.sim.packing.runner import SeedRun


def summary(policy: str, runs: Sequence[SeedRun], nodes: int, gpus: int) -> dict[str, object]:
    times = np.concatenate([np.asarray(r.decision_ms) for r in runs]) if runs else np.zeros(1)
    at_100 = [round(r.alloc_at_100, 4) for r in runs]
    return {
        "policy": policy,
        "nodes": nodes,
        "gpus": gpus,
        "seeds": [r.seed for r in runs],
        "pods": [r.pods for r in runs],
        "alloc_at_100": at_100,
        "alloc_at_100_median": round(float(np.median(at_100)), 4),
        "alloc_final": [round(r.alloc_final, 4) for r in runs],
        "arrived_final": [round(r.arrived_final, 4) for r in runs],
        "failed_pods": [r.failed_pods for r in runs],
        "decision_ms_p50": round(float(np.percentile(times, 50)), 4),
        "decision_ms_p99": round(float(np.percentile(times, 99)), 4),
    }
