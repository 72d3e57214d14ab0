"""Predictions from history: learned runtimes (runtimes.py), predicted starts by forking the simulator
and running it forward with the real core (starts.py), and their accuracy (accuracy.py)."""

from .accuracy import accuracy
from .runtimes import JobFeatures, RuntimeEstimate, RuntimeEstimator
from .starts import Prediction, predict_starts

__all__ = ["JobFeatures", "Prediction", "RuntimeEstimate", "RuntimeEstimator", "accuracy", "predict_starts"]
