"""Shared fixtures. Ray starts at most once per test session (init+shutdown costs ~5 s)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Every test runs with one intra-op thread. The models under test are tiny, so a second
    thread only adds spin-waiting on a busy 2-core box; and pinning it for the whole session (not
    per folder) keeps float results independent of which tests ran before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_session():
    """A local 2-CPU Ray instance shared by every test that asks for it."""
    from hotstep_ray.distributed.runtime import ensure_ray, shutdown_ray

    ray = ensure_ray(num_cpus=2)
    yield ray
    shutdown_ray()
