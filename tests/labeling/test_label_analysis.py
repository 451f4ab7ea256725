"""Pass A: Essentia finds the tempo and key synthesized songs were written with; cache rules."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from hotstep_ray.audio.synth import SongSpec
from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.analysis import (
    ANALYSIS_VERSION,
    EssentiaAnalyzer,
    FileStamp,
    decode_for_analysis,
    file_stamp,
    round_bpm,
)
from hotstep_ray.labeling.audio_prep import ANALYSIS_RATE_HZ, encode_mp3
from hotstep_ray.labeling.descriptors import describe

ANALYZER = EssentiaAnalyzer()


def test_finds_120_bpm_and_a_major_in_a_20_second_song(tmp_path, song_writer):
    # 48 kHz FLAC with tags: exercises decode-once, downmix, resampling to 44.1 kHz and tags.
    song_writer(
        tmp_path / "song.flac",
        SongSpec("Truth", 120, "A", "major", 20.0, 7),
        rate=48_000,
        tags={"artist": "Synth Band", "title": "Truth"},
    )
    started = time.process_time()
    features, tags = ANALYZER.analyze(Storage(tmp_path), "song.flac")
    assert time.process_time() - started < 5
    # The tempo estimator's resolution, not round-off: Essentia places beats on its onset-
    # detection frames (~10 ms, ~2% of a beat here) and bpm is rounded to an integer; an
    # octave error (60 / 240) or a wrong grid is far outside +-2.
    assert abs(features.bpm - 120) <= 2
    assert features.keyscale == "A major"
    # frames / rate from the FLAC header: exact, up to float rounding
    assert features.duration_s == pytest.approx(20.0, abs=0.01)
    assert tags == {"artist": "Synth Band", "title": "Truth"}
    assert features.descriptors["danceability"] > 0.5  # steady synthesized drums


@pytest.mark.parametrize("bpm", [90, 128])
def test_tempo_of_other_songs_within_one_bpm(tmp_path, song_writer, bpm):
    song_writer(tmp_path / "s.wav", SongSpec("t", bpm, "C", "major", 12.0, bpm))
    features, _ = ANALYZER.analyze(Storage(tmp_path), "s.wav")
    assert abs(features.bpm - bpm) <= 1  # the estimator's resolution, as above


def _minor_cadence(tonic_midi: int, seconds: float = 12.0) -> np.ndarray:
    """i-iv-V-i in harmonic minor (the leading tone makes the mode unambiguous), one chord per
    second, bass on the root."""
    rate = ANALYSIS_RATE_HZ
    chords = [(0, 3, 7), (5, 8, 12), (7, 11, 14), (0, 3, 7)]
    t = np.arange(rate) / rate
    out = []
    for i in range(int(seconds)):
        notes = chords[i % 4]
        tone = sum(np.sin(2 * np.pi * 440 * 2 ** ((tonic_midi + n - 69) / 12) * t) for n in notes)
        root = 440 * 2 ** ((tonic_midi + notes[0] - 12 - 69) / 12)
        tone = tone + 0.8 * np.sin(2 * np.pi * root * t)
        out.append(tone * np.exp(-t * 1.5))
    return (0.1 * np.concatenate(out)).astype(np.float32)


@pytest.mark.parametrize(("tonic", "name"), [(57, "A minor"), (62, "D minor"), (66, "F# minor")])
def test_minor_keys_are_found_exactly(tonic, name):
    features = ANALYZER.analyze_signal(_minor_cadence(tonic))
    assert features.keyscale == name


def test_bpm_is_rounded_half_up_like_the_seed():
    assert round_bpm(119.5) == 120
    assert round_bpm(120.49) == 120
    assert round_bpm(0.0) is None
    assert round_bpm(float("nan")) is None


def test_cache_is_used_only_for_the_same_file_and_analysis(tmp_path, song_writer):
    song_writer(tmp_path / "s.wav", SongSpec("t", 100, "C", "major", 3.0, 1))
    storage = Storage(tmp_path)
    features, _ = ANALYZER.analyze(storage, "s.wav")
    stamp = file_stamp(storage, "s.wav")
    record = {"essentia": features.to_record(), "durationCache": stamp.to_record(3.0)}

    cached = ANALYZER.cached(record, stamp)
    assert cached is not None and cached.bpm == features.bpm and cached.key == features.key
    assert cached.descriptors == features.descriptors
    # Changed size or mtime, another rhythm method, an older analysis version: recompute.
    assert ANALYZER.cached(record, FileStamp(stamp.size_bytes + 1, stamp.mtime_ms)) is None
    assert ANALYZER.cached(record, FileStamp(stamp.size_bytes, stamp.mtime_ms + 5)) is None
    assert EssentiaAnalyzer(rhythm_method="multifeature").cached(record, stamp) is None
    old = {**record, "essentia": {**record["essentia"], "version": ANALYSIS_VERSION - 1}}
    assert ANALYZER.cached(old, stamp) is None

    os.utime(tmp_path / "s.wav", ns=(1, 1))
    assert ANALYZER.cached(record, file_stamp(storage, "s.wav")) is None


def test_record_keeps_the_seeds_keys():
    features = ANALYZER.analyze_signal(_minor_cadence(57, 4.0))
    record = features.to_record()
    assert {"bpm", "key", "scale", "loudness", "danceability"} <= set(record)
    assert record["key"] == "A" and record["scale"] == "minor"


def test_decode_downmixes_and_resamples_to_44k(tmp_path, song_writer):
    song_writer(tmp_path / "s.wav", SongSpec("t", 100, "C", "major", 2.0, 1), rate=22_050)
    song = decode_for_analysis(Storage(tmp_path), "s.wav")
    assert song.mono.ndim == 1 and song.mono.dtype == np.float32
    # a resampler's length convention (ceil / floor, trimmed filter delay) moves a few samples;
    # a missed resample is 44,100 off
    assert len(song.mono) == pytest.approx(2 * ANALYSIS_RATE_HZ, abs=10)


def test_descriptors_tell_a_steady_tone_from_a_drum_groove():
    t = np.arange(ANALYSIS_RATE_HZ * 5) / ANALYSIS_RATE_HZ
    tone = describe((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), ANALYSIS_RATE_HZ, 120)
    assert tone["danceability"] == 0.0 and tone["onset_rate"] == 0.0
    # a Hann-windowed 220 Hz tone's centroid is 220 Hz up to window leakage into the few bins
    # around it (a few Hz); 5% still fails a centroid taken over the wrong axis or rate
    assert tone["brightness_hz"] == pytest.approx(220, rel=0.05)


def test_mp3_for_captioners_is_96_kbps_stereo_44k(tmp_path):
    t = np.arange(48_000 * 4) / 48_000
    mono = (0.2 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)[None, :]
    data = encode_mp3(mono, 48_000)
    assert data[:3] == b"ID3" or data[0] == 0xFF
    # CBR 96 kbps plus the tag / header frames and encoder padding; the neighbouring standard
    # rates (80, 112 kbps) are outside 10%
    assert len(data) * 8 / 4 / 1000 == pytest.approx(96, rel=0.1)
    import io

    import soundfile as sf

    info = sf.info(io.BytesIO(data))
    assert (info.samplerate, info.channels) == (44_100, 2)
