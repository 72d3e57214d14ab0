"""Fixtures for the simulator tests: the repository's sample data and the shared traces (when present)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpujoins import GpuJoins, count_gpu_joins

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``<repo>/../shared/traces``: CI has it; a lone clone skips the tests that need it."""
    p = REPO.parent / "shared" / "traces"
    if not (p / "golden").is_dir():
        pytest.skip(f"shared traces not found at {p} (clone the repo beside shared/ to run this test)")
    return p


@pytest.fixture
def gpu_joins(monkeypatch: pytest.MonkeyPatch) -> GpuJoins:
    """Counts the binds onto a GPU other shares or slices already held (``gpujoins``)."""
    return count_gpu_joins(monkeypatch)
