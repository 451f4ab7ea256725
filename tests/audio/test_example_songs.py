"""The bundled songs are deterministic and really are at their declared tempo and key."""

from __future__ import annotations

import numpy as np

from hotstep_ray.audio.io import load_audio
from hotstep_ray.audio.synth import NOTE_NAMES, SongSpec, render_song
from hotstep_ray.core.storage import Storage


def test_render_is_deterministic_and_peak_normalised():
    spec = SongSpec("t", 120, "A", "major", 2.0, seed=7)
    a, b = render_song(spec, 16_000), render_song(spec, 16_000)
    assert a.shape == (2, 32_000) and np.array_equal(a, b)  # same code, same process: exact
    # the peak sample times target / peak, rounded to float32: <= 1 ulp (6e-8) of 0.89
    assert abs(float(np.abs(a).max()) - 10 ** (-1 / 20)) < 1e-6


def test_tempo_is_audible_in_the_onset_envelope():
    rate, bpm = 8_000, 120
    audio = render_song(SongSpec("t", bpm, "C", "major", 8.0, seed=1), rate).mean(axis=0)
    hop = 80  # 10 ms frames
    energy = np.add.reduceat(audio**2, np.arange(0, len(audio), hop))
    onset = np.maximum(np.diff(energy), 0)
    onset -= onset.mean()
    lags = np.arange(25, 100)  # 0.25-1 s per beat = 60-240 BPM
    ac = [float(np.dot(onset[:-lag], onset[lag:])) for lag in lags]
    beat_s = lags[int(np.argmax(ac))] * hop / rate
    # one 10 ms lag step is ~2.4 BPM at 120, so +-2 asks for the exact beat lag (or its double)
    assert abs(60 / beat_s - bpm) <= 2 or abs(120 / beat_s - bpm) <= 2


def test_key_tonic_dominates_the_chroma():
    rate = 8_000
    audio = render_song(SongSpec("t", 100, "E", "minor", 6.0, seed=2), rate).mean(axis=0)
    spectrum = np.abs(np.fft.rfft(audio))
    freqs = np.fft.rfftfreq(len(audio), 1 / rate)
    chroma = np.zeros(12)
    band = (freqs > 60) & (freqs < 2000)
    notes = np.round(12 * np.log2(freqs[band] / 440.0) + 69).astype(int) % 12
    np.add.at(chroma, notes, spectrum[band] ** 2)
    top3 = {NOTE_NAMES[i] for i in np.argsort(chroma)[-3:]}
    assert "E" in top3


def test_example_catalogue_writes_every_format_and_sidecar(tmp_path):
    from hotstep_ray.audio.example_songs import CATALOGUE, write_example_songs

    storage = Storage(tmp_path)
    keys = write_example_songs(storage)
    assert len(keys) == 12 and {k.rsplit(".", 1)[1] for k in keys} == {"flac", "wav", "ogg", "mp3"}
    audio, rate = load_audio(storage, "03_sunrise.flac")
    assert rate == 48_000 and audio.shape == (2, 5 * 48_000)
    # sidecars are written verbatim; a user's edit survives a rerun
    storage.write_text("11_last_call.txt", "caption: edited by me\n")
    write_example_songs(storage)
    assert storage.read_text("11_last_call.txt") == "caption: edited by me\n"
    assert sum(len(sidecars) for _, _, sidecars in CATALOGUE) == 12
