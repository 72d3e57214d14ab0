"""Seeded chaos runs on a real local cluster (`make chaos`; a short one in `make test`)."""
