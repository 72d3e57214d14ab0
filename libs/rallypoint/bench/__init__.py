"""Benchmarks, load generators and the scale harness (fleets of simulated nodes, log and metric readers).

They live apart from the product so that the local cluster, the simulator and the services hold only what
they run: product code never imports this package; ``rally bench``, ``make bench`` and the tests do.
"""
