"""Fixtures of the MM3 tests: one tiny MM3 checkpoint per session (real layout, MM3-only:
`<checkpoints>/mm3/MiniMax-Music3/`, no ACE folders) (helpers: `mm3_helpers.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The MM3 tests run tiny models whose ops are far too small to split across threads; on a
    busy 2-core box the second thread only adds spin-waiting (2x slower rollouts)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def mm3_checkpoints(tmp_path_factory) -> Path:
    """A checkpoints folder holding only the tiny MM3 (an MM3-only install)."""
    from hotstep_ray.mm3.tiny import write_tiny_mm3

    root = tmp_path_factory.mktemp("checkpoints")
    write_tiny_mm3(root / "mm3" / "MiniMax-Music3", seed=0)
    return root
