"""The one resampler (libsoxr HQ): exact tone positions, its length convention, the band limit,
planar channels kept apart, and the torch adapter that mm3 and the benchmarks call."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hotstep_ray.audio.resample import resample
from hotstep_ray.preprocess import resample as torch_resample


def _tones(freq: float, rate: int) -> np.ndarray:
    """[2, rate]: one second of sin and cos at `freq`, in float64 (exact sample times)."""
    t = np.arange(rate) / rate
    return np.stack([np.sin(2 * math.pi * freq * t), np.cos(2 * math.pi * freq * t)])


@pytest.mark.parametrize(
    ("orig", "new", "freq"),
    [
        (44100, 48000, 440.0),
        (44100, 48000, 17000.0),
        (8000, 48000, 1000.0),
        (96000, 48000, 3000.0),
        (48000, 44100, 440.0),
        (22050, 44100, 5000.0),
    ],
)
def test_a_tone_lands_on_its_analytic_samples(orig: int, new: int, freq: float) -> None:
    y = resample(_tones(freq, orig).astype(np.float32), orig, new)
    assert y.dtype == np.float32 and y.shape == (2, new)
    # The filter is one-sided at the ends: HQ's transient spans ~400 output samples of an 8 kHz
    # source upsampled 6x (~8 ms), ~70 at 44.1 -> 48 kHz; 600 is room on the longest.
    edge = 600
    err = np.abs(y[:, edge:-edge] - _tones(freq, new)[:, edge:-edge]).max()
    # HQ is 20-bit (~1e-6) on a unit tone, its passband ripple at 17 kHz of 22.05 kHz ~6e-5 and
    # float32 rounding ~1e-7; 1e-4 holds those, while a one-sample shift is >= 5e-2.
    assert err < 1e-4


def test_lengths_identity_and_one_dimensional_input() -> None:
    x = np.random.default_rng(0).standard_normal((2, 44101)).astype(np.float32)
    # round(T * new / orig): 48001.09 -> 48001; 37 at 96 -> 48 kHz is 18.5 -> 19
    assert resample(x, 44100, 48000).shape == (2, 48001)
    assert resample(x[:, :37], 96000, 48000).shape == (2, 19)
    assert resample(x[:, :0], 44100, 48000).shape == (2, 0)
    same = resample(x, 48000, 48000)
    assert np.array_equal(same, x) and same is not x
    mono = resample(x[0], 44100, 48000)
    assert mono.shape == (48001,)
    np.testing.assert_array_equal(mono, resample(x, 44100, 48000)[0])  # rows run one by one
    assert resample(x.astype(np.float64), 22050, 44100).dtype == np.float32
    with pytest.raises(ValueError, match="sample rates must be positive"):
        resample(x, 0, 48000)
    with pytest.raises(ValueError, match=r"expected \[T\] or \[C, T\]"):
        resample(x[None], 44100, 48000)


def test_downsampling_removes_what_the_new_rate_cannot_hold() -> None:
    t = np.arange(48000) / 48000
    # 23 kHz cannot exist at 44.1 kHz: it must be removed, not folded to 21.1 kHz (0.7 RMS).
    folded = resample(np.sin(2 * math.pi * 23000 * t)[None], 48000, 44100)
    assert np.sqrt(np.mean(folded[:, 500:-500] ** 2)) < 1e-3  # HQ leaves ~1e-7
    # 19 kHz is in the passband (flat to ~0.93 of 22.05 kHz): kept at full amplitude
    kept = resample(np.sin(2 * math.pi * 19000 * t)[None], 48000, 44100)
    assert np.sqrt(2 * np.mean(kept[:, 500:-500] ** 2)) == pytest.approx(1.0, abs=2e-3)


def test_planar_channels_stay_apart() -> None:
    x = np.zeros((2, 44100), np.float32)
    x[0] = np.sin(2 * math.pi * 440 * np.arange(44100) / 44100)
    y = resample(x, 44100, 48000)
    assert np.abs(y[1]).max() == 0.0 and np.abs(y[0]).max() > 0.99


def test_the_torch_adapter_returns_the_same_samples_as_cpu_float32() -> None:
    x = torch.randn(2, 4410, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = torch_resample.resample(x, 44100, 48000)
    assert got.dtype == torch.float32 and got.shape == (2, 4800)
    want = resample(x.numpy().astype(np.float32), 44100, 48000)
    np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(ValueError, match=r"expected \[C, T\]"):
        torch_resample.resample(x[0], 44100, 48000)
