"""Converters from public GPU-cluster traces (Philly, Alibaba openb, the golden slice) to the simulator's
canonical workload, cluster and queue formats."""
