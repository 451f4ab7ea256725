"""The audio path: decode, resample to 48 kHz stereo planar, cut, normalise, and every documented
outcome for awkward files. No models: these run in well under a second each."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from preprocess_support import LEFT_HZ, RIGHT_HZ, tone, write_tone

from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.audio_prep import AudioError, prepare_audio
from hotstep_ray.preprocess.resample import resample, resample_whole_bank

RATE = 48000
# `resample` (float32) against the whole filter bank in float64, on N(0, 1) input (|x| <= ~4.5):
# rounding the input and taps to float32 and summing <= ~140 nonzero taps in float32 gives a few
# 1e-6 at the worst of ~20k outputs, whatever order the GEMM or conv sums in; so 1e-5. A wrong
# tap, phase or group boundary is off by the signal's own size.
FLOAT32_VS_FLOAT64 = 1e-5


def peak_hz(signal: np.ndarray, rate: int) -> float:
    """The dominant frequency, to ~0.01 Hz: Hann window, 16x zero padding, parabolic fit."""
    n = len(signal)
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(n), n * 16))
    spectrum[:16] = 0.0  # ignore DC
    k = int(np.argmax(spectrum))
    a, b, c = np.log(spectrum[k - 1 : k + 2] + 1e-30)
    offset = 0.5 * (a - c) / (a - 2 * b + c)
    return (k + offset) * rate / (n * 16)


@pytest.mark.parametrize(
    ("orig", "new", "freq"),
    [(44100, 48000, 440.0), (44100, 48000, 17000.0), (8000, 48000, 1000.0), (96000, 48000, 3000.0)],
)
def test_resample_matches_the_analytic_tone(orig: int, new: int, freq: float) -> None:
    t = torch.arange(orig, dtype=torch.float64) / orig  # 1 s
    x = torch.stack([torch.sin(2 * math.pi * freq * t), torch.cos(2 * math.pi * freq * t)])
    y = resample(x.float(), orig, new)
    assert y.shape == (2, new)
    ref = torch.arange(new, dtype=torch.float64) / new
    expected = torch.stack(
        [torch.sin(2 * math.pi * freq * ref), torch.cos(2 * math.pi * freq * ref)]
    )
    edge = 200  # the filter is one-sided at the ends
    # The Kaiser (beta 12) sinc's passband ripple and float32 rounding are each ~1e-6 on a unit
    # tone; 1e-4 is room on that, while a one-sample shift is >= 5e-2 (at 440 Hz and up).
    assert (y[:, edge:-edge].double() - expected[:, edge:-edge]).abs().max() < 1e-4


def test_resample_lengths_identity_and_band_limit() -> None:
    x = torch.randn(2, 44101)
    assert resample(x, 44100, 48000).shape[1] == math.ceil(44101 * 48000 / 44100)
    assert torch.equal(resample(x, 48000, 48000), x)
    # 23 kHz cannot exist at 44.1 kHz: downsampling must remove it, not fold it to 21.1 kHz.
    t = torch.arange(48000, dtype=torch.float64) / 48000
    folded = resample(torch.sin(2 * math.pi * 23000 * t)[None].float(), 48000, 44100)
    # 23 kHz sits just past the cutoff (0.945 x 22.05 kHz), in the filter's stopband skirt: well
    # under -60 dB, against 0.7 RMS folded through unfiltered. A filter property, not round-off.
    assert folded[:, 500:-500].pow(2).mean().sqrt() < 1e-3


@pytest.mark.parametrize(
    ("orig", "new"),
    [(44100, 48000), (22050, 48000), (16000, 48000), (96000, 48000), (48000, 44100)],
)
@pytest.mark.parametrize("length", [1, 37, 300, 9001])
def test_grouped_phases_equal_the_whole_filter_bank(orig: int, new: int, length: int) -> None:
    """`resample` (phase-grouped GEMMs where they apply, else the conv1d) gives what the whole
    bank gives as one strided conv1d (every tap, zeros included) in float64: up- and
    downsampling, a length shorter than the filter, odd lengths."""
    x = torch.randn(2, length, generator=torch.Generator().manual_seed(length), dtype=torch.float64)
    want = resample_whole_bank(x, orig, new)
    got = resample(x, orig, new)
    assert want.dtype == torch.float64 and got.dtype == torch.float32
    assert got.shape == want.shape == (2, math.ceil(length * new / orig))
    assert (got.double() - want).abs().max() < FLOAT32_VS_FLOAT64


@pytest.mark.parametrize(
    ("orig", "gemms"),
    [
        (44100, True),  # 160 / 147: 4 groups of ~104 taps, rows 147 apart
        (22050, True),
        (8000, False),  # 6 / 1: 69-tap groups, rows 1 apart
        (16000, False),
        (24000, False),
        (32000, False),  # 3 / 2
        (96000, False),  # 1 / 2: one 137-tap phase
        (48000, False),  # equal rates: a copy
    ],
)
def test_overlapping_groups_run_the_whole_bank_as_conv1d(
    orig: int, gemms: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group spanning more taps than `down` would make its window view's rows overlap, and the
    matmul would copy the whole view (4-20x slower, gigabytes per song): those ratios run the
    whole bank as one conv1d instead, with the same values."""
    from hotstep_ray.preprocess import resample as module

    assert module.uses_phase_groups(orig, RATE) is gemms
    up, down = RATE // math.gcd(orig, RATE), orig // math.gcd(orig, RATE)
    if up != down:
        args = (module.ZERO_CROSSINGS, module.ROLLOFF, module.KAISER_BETA, module.PHASE_GROUPS)
        _, _, groups = module._phase_groups(up, down, *args)
        assert (groups is not None) is gemms
        assert groups is None or all(hi - lo <= down for _, _, lo, hi, _ in groups)
    calls: list[tuple[int, ...]] = []
    conv1d = torch.nn.functional.conv1d

    def spy(signal: torch.Tensor, weight: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append(tuple(weight.shape))
        return conv1d(signal, weight, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv1d", spy)
    x = torch.randn(2, 3001, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = resample(x, orig, RATE)
    assert len(calls) == (0 if gemms or up == down else 1)
    calls.clear()
    want = resample_whole_bank(x, orig, RATE)
    assert (got.double() - want).abs().max() < FLOAT32_VS_FLOAT64
    assert len(calls) == (0 if up == down else 1)  # the reference is the conv1d itself


def test_phase_group_count_is_part_of_the_cache_key() -> None:
    """The group count is an argument of the cached `_phase_groups`, not a global it reads."""
    from hotstep_ray.preprocess import resample as module

    args = (160, 147, module.ZERO_CROSSINGS, module.ROLLOFF, module.KAISER_BETA)
    assert len(module._phase_groups(*args)[2]) == module.PHASE_GROUPS
    assert len(module._phase_groups(*args, 8)[2]) == 8
    assert module._phase_groups(*args, 1)[2] is None  # one group: all 215 taps, rows 147 apart
    x = torch.randn(2, 4410, generator=torch.Generator().manual_seed(2))
    want = resample_whole_bank(x.double(), 44100, RATE)
    for count in (1, 4, 8, 16):
        got = resample(x, 44100, RATE, phase_groups=count)
        assert (got.double() - want).abs().max() < FLOAT32_VS_FLOAT64
    with pytest.raises(ValueError, match="phase_groups must be >= 1"):
        resample(x, 44100, RATE, phase_groups=0)


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".ogg", ".mp3"])
def test_pitch_and_channels_survive_every_container(tmp_path: Path, suffix: str) -> None:
    write_tone(tmp_path / f"lr{suffix}", 2.0, 44100)
    prepared = prepare_audio(Storage(tmp_path), f"lr{suffix}", 240.0, "none")
    audio = prepared.audio
    assert audio.dtype == np.float32 and audio.shape[0] == 2  # planar [2, T]
    assert prepared.source_rate_hz == 44100
    # lossy codecs pad a few ms; WAV/FLAC come out exactly 2 s at 48 kHz
    assert abs(audio.shape[1] - 2 * RATE) < 0.1 * RATE
    if suffix in (".wav", ".flac"):
        assert audio.shape[1] == 2 * RATE
    # peak_hz resolves ~0.01 Hz on a 2 s tone (~2e-5 relative) and no codec moves pitch; 1e-3
    # still fails a rate mix-up as small as 44.1 vs 44.144 kHz, an octave (0.5) or a swap (1.5).
    left, right = peak_hz(audio[0], RATE), peak_hz(audio[1], RATE)
    assert left / LEFT_HZ == pytest.approx(1.0, abs=1e-3)  # not an octave down (trap 13)
    assert right / RIGHT_HZ == pytest.approx(1.0, abs=1e-3)  # and not swapped


def test_mono_8k_is_duplicated_and_upsampled(tmp_path: Path) -> None:
    write_tone(tmp_path / "mono.wav", 0.5, 8000, channels=1)
    prepared = prepare_audio(Storage(tmp_path), "mono.wav", 240.0, "none")
    assert prepared.audio.shape == (2, RATE // 2)
    assert prepared.source_channels == 1 and prepared.source_rate_hz == 8000
    np.testing.assert_array_equal(prepared.audio[0], prepared.audio[1])
    assert peak_hz(prepared.audio[0], RATE) == pytest.approx(LEFT_HZ, rel=1e-3)  # as above


def test_long_file_is_cut_exactly_at_max_duration(tmp_path: Path) -> None:
    write_tone(tmp_path / "long.wav", 30.0, 44100)
    storage = Storage(tmp_path)
    cut = prepare_audio(storage, "long.wav", 10.0, "none")
    whole = prepare_audio(storage, "long.wav", 0.0, "none")  # 0 = never cut
    assert cut.truncated and not whole.truncated
    assert cut.audio.shape == (2, 10 * RATE) and whole.audio.shape == (2, 30 * RATE)
    assert cut.source_duration_s == pytest.approx(30.0)  # frames / rate: exact up to rounding
    # The cut is the start of the whole song, filtered with real signal past the cut point. Same
    # filter on the same samples in this process, only the length differs: float32 round-off
    # of a 0.3 tone (~1e-7) at most; a cut filtered against zeros has an edge transient >> 1e-5.
    np.testing.assert_allclose(cut.audio, whole.audio[:, : 10 * RATE], atol=1e-5)


def test_peak_normalisation_hits_the_target(tmp_path: Path) -> None:
    write_tone(tmp_path / "quiet.wav", 0.5, 48000)
    prepared = prepare_audio(Storage(tmp_path), "quiet.wav", 240.0, "peak", -3.0)
    # one float32 gain multiply: a few eps (1.2e-7) relative, so rel 1e-5
    assert np.abs(prepared.audio).max() == pytest.approx(10 ** (-3 / 20), rel=1e-5)
    # the file's peak is the sampled sine's peak, not exactly 0.3: sampling a 440 Hz sine at
    # 48 kHz misses its crest by <= 4.1e-4 relative, 16-bit PCM rounds by <= 5e-5: <= 0.004 dB
    assert prepared.gain_db == pytest.approx(-3.0 - 20 * math.log10(0.3), abs=0.01)


def _write_bad(folder: Path) -> None:
    (folder / "empty.wav").write_bytes(b"")
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" + bytes(range(256)))
    sf.write(str(folder / "zero.wav"), np.zeros((0, 2)), 44100)
    sf.write(str(folder / "blip.wav"), tone(0.01, 48000), 48000)  # 10 ms < one latent frame
    sf.write(str(folder / "surround.wav"), tone(0.2, 48000, channels=6), 48000)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty.wav", "empty file (0 bytes)"),
        ("corrupt.wav", "cannot"),
        ("zero.wav", "no audio frames"),
        ("blip.wav", "too short"),
        ("surround.wav", "6 channels: only mono or stereo is supported"),
        ("missing.wav", "cannot read"),
    ],
)
def test_bad_files_get_their_documented_error(tmp_path: Path, name: str, message: str) -> None:
    _write_bad(tmp_path)
    with pytest.raises(AudioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_audio(Storage(tmp_path), name)
