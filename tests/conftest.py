"""Shared fixtures and the suite's schedule.

The suite runs on pytest-xdist workers (`-n auto` in pyproject.toml): one per core, at most
MAX_WORKERS, each with its own Ray instance (started at most once per worker). Whole files go
to one worker, so a file's module fixtures are built once, and files with slow tests are handed
out first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train's controller polls its workers every 2 s (its default): a run's start, each report
# and its end wait for the next poll, seconds per run that are most of a tiny run. Polled every
# 0.2 s instead, the same runs take a third less here. A poll that takes longer is no error (Ray
# counts a worker dead only after RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 10 min), so a busy
# 2-core box changes nothing but the wait. Set before any Ray starts, so every worker and
# `ray start` node of the session inherits it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
FIXTURES = Path(__file__).parent / "fixtures"
# Each worker holds its own Ray instance (~1 GiB with its idle workers) and tiny trees; past a
# few workers a bigger machine gains little, since the longest files bound the run.
MAX_WORKERS = 4
# Files whose tests share a session fixture too costly to build once per worker (the studio's
# whole pipeline run): each set runs on one worker.
SHARED_WORKER = {
    "tests/studio/test_page_chromium.py": "studio_pipeline",
    "tests/studio/test_pipeline_http.py": "studio_pipeline",
}


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core, at most MAX_WORKERS (PYTEST_XDIST_AUTO_NUM_WORKERS wins)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_WORKER.get(path, path)


def pytest_xdist_make_scheduler(config, log):
    """Whole files (or SHARED_WORKER sets) go to one worker, in collection order: xdist's
    `loadfile`, less its reordering by test count and with the shared sets. Only in place of
    the default `--dist load`; another `--dist` given on the command line keeps xdist's own."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the slow-first order below
    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """Hand out the work units holding slow tests first (Ray pipelines before other slow files
    before the rest), keeping each unit's own order, so no long file starts last while the
    other cores sit idle."""
    ranks: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("slow") is None:
            rank = 2
        else:
            rank = 0 if item.get_closest_marker("ray") is not None else 1
        unit = _work_unit(item.nodeid)
        ranks[unit] = min(ranks.get(unit, 2), rank)
    order = {unit: (rank, index) for index, (unit, rank) in enumerate(ranks.items())}
    items.sort(key=lambda item: order[_work_unit(item.nodeid)])


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
    """A local 2-CPU Ray instance shared by every test of this worker that asks for it."""
    from hotstep_ray.distributed.runtime import ensure_ray, shutdown_ray

    ray = ensure_ray(num_cpus=2)
    yield ray
    shutdown_ray()
