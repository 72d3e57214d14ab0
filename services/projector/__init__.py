"""`rally serve projector`: the event log projected into PostgreSQL read models and an audit archive."""
