"""A whole local cluster in real processes, for `rally up`, `rally demo` and end-to-end tests.

The names below are imported on first use (PEP 562): the rank probe (``localcluster.rankprobe``) runs as
every test and demo rank, and importing the supervisor with it (NATS, the event log, the servers) cost
each rank ~1 s of CPU before it did anything, 8 s for an 8-rank gang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.lazyexports import lazy_exports

if TYPE_CHECKING:
    from .supervisor import ClusterInfo, LocalCluster

#: Each public name -> the module of this package that defines it.
_HOMES = {"ClusterInfo": ".supervisor", "LocalCluster": ".supervisor"}

__all__ = ["ClusterInfo", "LocalCluster"]

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
