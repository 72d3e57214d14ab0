"""The HTTP API: a thin aiohttp shell that validates submissions, appends them to the log, and answers
queries from its own fold of the log (``ClusterState``). It makes no scheduling decision.
"""

from .app import ApiConfig, build_app
from .fold import FoldFollower

__all__ = ["ApiConfig", "FoldFollower", "build_app"]
