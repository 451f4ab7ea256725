"""Shared fixtures. Ray starts at most once per test session (init+shutdown costs ~5 s)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def ray_session():
    """A local 2-CPU Ray instance shared by every test that asks for it."""
    from hotstep_ray.distributed.runtime import ensure_ray, shutdown_ray

    ray = ensure_ray(num_cpus=2)
    yield ray
    shutdown_ray()
