"""The `rally` command line: one module per command group, wired together in ``main``."""
