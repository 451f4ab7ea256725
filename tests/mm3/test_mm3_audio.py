"""Preprocessing audio: 44.1 kHz planar stereo keeps L and R apart (trap 13) and a 440 Hz tone
comes back at 440 Hz (trap 14)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mm3_helpers import sine, wav_bytes

from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import SAMPLE_RATE_HZ
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.preprocess import dominant_frequency, prepare_audio

# Two float32 encodes by the tiny DAV (31 convs, reductions of K = 7..256 terms, activations and
# latents |x| <~ 1) that sum in another order (another batch slot or window length, another CPU's
# SIMD width) differ by round-off: a random walk of u sqrt(Σ_l K_l / 2) ~ 1.5e-6 of |x|
# (u = eps_f32 / 2), a few times that at the worst of the 128 x 87 latents. A channel leak misses
# by O(|x|), windows with too little context by the cut-off part of the receptive field.
DAV_ATOL = 1e-5


def test_440_hz_through_the_preprocessing_resample_comes_back_at_440(tmp_path):
    source = Storage(tmp_path)
    source.write_bytes("tone.wav", wav_bytes(sine(440.0, 2.0, 48_000)[None], 48_000))  # mono 48k
    audio, facts = prepare_audio(source, "tone.wav")
    assert audio.shape == (2, 2 * SAMPLE_RATE_HZ) and facts["source_rate_hz"] == 48_000
    # +-0.5 Hz = one FFT bin of the 2 s signal. The tone sits on a bin, so the peak estimate is
    # exact but for round-off; a wrong resample ratio (48 vs 44.1 kHz) moves it by ~40 Hz.
    for row in audio.numpy():
        assert dominant_frequency(row, SAMPLE_RATE_HZ) == pytest.approx(440.0, abs=0.5)
    # The interleaving bug of trap 13 (first half of an interleaved buffer read as "left")
    # is exactly what this measurement catches: it reads 220 Hz.
    interleaved = audio.numpy().T.reshape(-1)
    buggy_left = interleaved[: audio.shape[1]]
    assert dominant_frequency(buggy_left, SAMPLE_RATE_HZ) == pytest.approx(220.0, abs=0.5)


def test_stereo_keeps_its_channels_through_preprocessing(tmp_path, mm3_checkpoints):
    source = Storage(tmp_path)
    left, right = sine(440.0, 1.0, 48_000), sine(660.0, 1.0, 48_000, amplitude=0.3)
    source.write_bytes("lr.wav", wav_bytes(np.stack([left, right]), 48_000))
    audio, _ = prepare_audio(source, "lr.wav")
    # +-1 Hz = one FFT bin of the 1 s signal
    assert dominant_frequency(audio[0].numpy(), SAMPLE_RATE_HZ) == pytest.approx(440.0, abs=1.0)
    assert dominant_frequency(audio[1].numpy(), SAMPLE_RATE_HZ) == pytest.approx(660.0, abs=1.0)

    dav = ckpt.load_dav(ckpt.Mm3Paths.find(mm3_checkpoints))
    latents = dav.encode(audio)  # [128, L]: rows 0-63 from the left channel only
    assert latents.shape == (128, -(-audio.shape[1] // 512))
    left_only = dav.encode(torch.stack([audio[0], torch.zeros_like(audio[1])]))
    assert torch.allclose(latents[:64], left_only[:64], atol=DAV_ATOL)
    # zeroing the right input changes the right latents by O(|x|), far past round-off
    assert not torch.allclose(latents[64:], left_only[64:], atol=1e-3)
    swapped = dav.encode(audio.flip(0))
    assert torch.allclose(swapped[:64], latents[64:], atol=DAV_ATOL)
    # Windowed encoding (with context) equals one pass.
    whole = dav.encode(audio, window_latents=10_000)
    assert torch.allclose(
        dav.encode(audio, window_latents=16, context_latents=8), whole, atol=DAV_ATOL
    )
