"""Fixtures of the MM3 tests: one tiny MM3 checkpoint per session (real layout, MM3-only:
`<checkpoints>/mm3/MiniMax-Music3/`, no ACE folders) (helpers: `mm3_helpers.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mm3_checkpoints(tmp_path_factory) -> Path:
    """A checkpoints folder holding only the tiny MM3 (an MM3-only install)."""
    from hotstep_ray.mm3.tiny import write_tiny_mm3

    root = tmp_path_factory.mktemp("checkpoints")
    write_tiny_mm3(root / "mm3" / "MiniMax-Music3", seed=0)
    return root
