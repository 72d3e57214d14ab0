"""A whole local cluster in real processes, for `rally up`, `rally demo` and end-to-end tests."""

from .supervisor import ClusterInfo, LocalCluster

__all__ = ["ClusterInfo", "LocalCluster"]
