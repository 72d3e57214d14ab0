"""The scheduler service: leader-elected, fenced, a thin shell over the pure core."""
