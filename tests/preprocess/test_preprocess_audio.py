"""The audio path: decode, resample to 48 kHz stereo planar, cut, normalise, and every documented
outcome for awkward files. No models: these run in well under a second each. The resampler's
own tests are tests/audio/test_resample.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from preprocess_support import LEFT_HZ, RIGHT_HZ, tone, write_tone

from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.audio_prep import AudioError, prepare_audio

RATE = 48000


def peak_hz(signal: np.ndarray, rate: int) -> float:
    """The dominant frequency, to ~0.01 Hz: Hann window, 16x zero padding, parabolic fit."""
    n = len(signal)
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(n), n * 16))
    spectrum[:16] = 0.0  # ignore DC
    k = int(np.argmax(spectrum))
    a, b, c = np.log(spectrum[k - 1 : k + 2] + 1e-30)
    offset = 0.5 * (a - c) / (a - 2 * b + c)
    return (k + offset) * rate / (n * 16)


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
