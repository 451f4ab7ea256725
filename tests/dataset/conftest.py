"""Fixtures of the dataset tests: a storage root on local disk or in memory, and tiny WAVs."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import soundfile as sf

from hotstep_ray.core.storage import Storage


def _new_storage(kind: str, tmp_path) -> Storage:
    if kind == "local":
        (tmp_path / "root").mkdir()
        return Storage(tmp_path / "root")
    return Storage(f"memory://hotstep-test-{uuid.uuid4().hex}")


@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path) -> Iterator[Storage]:
    """An empty storage root: a local folder, then the same test on fsspec's memory filesystem."""
    root = _new_storage(request.param, tmp_path)
    if not root.is_local:
        root.makedirs("")
    yield root
    if not root.is_local:
        root.delete("", recursive=True)


def make_wav(seconds: float = 0.5, sample_rate_hz: int = 8000) -> bytes:
    """A mono 16-bit WAV of a quiet sine (tiny: 0.5 s at 8 kHz is 8 kB)."""
    t = np.arange(int(seconds * sample_rate_hz)) / sample_rate_hz
    buffer = io.BytesIO()
    sf.write(buffer, 0.1 * np.sin(2 * np.pi * 440 * t), sample_rate_hz, "PCM_16", format="WAV")
    return buffer.getvalue()


@pytest.fixture
def wav() -> Callable[..., bytes]:
    return make_wav
