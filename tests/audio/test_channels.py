"""The shared channel layouts (preprocessing and labeling both use them)."""

from __future__ import annotations

import numpy as np

from hotstep_ray.audio.channels import to_mono, to_stereo


def test_to_stereo_duplicates_mono_and_keeps_the_first_two_channels():
    mono = np.arange(5, dtype=np.float64)
    assert to_stereo(mono).shape == (2, 5) and to_stereo(mono).dtype == np.float32
    np.testing.assert_array_equal(to_stereo(mono[None])[1], mono)
    six = np.arange(30, dtype=np.float32).reshape(6, 5)
    np.testing.assert_array_equal(to_stereo(six), six[:2])
    stereo = six[:2].copy()
    assert to_stereo(stereo) is stereo or np.shares_memory(to_stereo(stereo), stereo)  # no copy


def test_to_mono_averages_channels():
    audio = np.array([[1.0, 3.0], [3.0, 5.0]], np.float32)
    np.testing.assert_array_equal(to_mono(audio), [2.0, 4.0])
    assert to_mono(audio[0]).shape == (2,) and to_mono(audio).dtype == np.float32
