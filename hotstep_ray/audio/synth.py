"""A small deterministic song synthesizer for the bundled examples and tests.

Each song is drums (kick, snare, hi-hat), a bass line on the chord roots, sustained chords and a
melody drawn from the key's pentatonic scale, at a known tempo and key — so analyzers (BPM/key) have
a right answer to find. Same spec ⇒ same samples, bit for bit (numpy's seeded Generator only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOTE_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")
MAJOR_STEPS = (0, 2, 4, 5, 7, 9, 11)
MINOR_STEPS = (0, 2, 3, 5, 7, 8, 10)
# Scale degrees (0-based) of the chord roots: I-V-vi-IV in major, i-VI-III-VII in minor.
MAJOR_PROGRESSION = (0, 4, 5, 3)
MINOR_PROGRESSION = (0, 5, 2, 6)


@dataclass(frozen=True)
class SongSpec:
    title: str
    bpm: int
    root: str  # "A", "F#"
    mode: str  # "major" | "minor"
    duration_s: float
    seed: int
    beats_per_bar: int = 4

    @property
    def key(self) -> str:
        return f"{self.root} {self.mode}"


def midi_to_hz(note: float) -> float:
    return 440.0 * 2.0 ** ((note - 69) / 12)


def _envelope(n: int, rate: int, attack_s: float, decay_s: float) -> np.ndarray:
    t = np.arange(n) / rate
    attack = np.clip(t / max(attack_s, 1e-4), 0, 1)
    return attack * np.exp(-t / decay_s)


def _add(out: np.ndarray, start: int, signal: np.ndarray) -> None:
    end = min(len(out), start + len(signal))
    if start < end:
        out[start:end] += signal[: end - start]


def render_song(spec: SongSpec, rate: int = 48_000) -> np.ndarray:
    """Render a song to float32 stereo `[2, T]`, peak-normalised to -1 dBFS."""
    rng = np.random.default_rng(spec.seed)
    total = int(spec.duration_s * rate)
    beat = 60.0 / spec.bpm
    beat_n = int(round(beat * rate))
    steps = MAJOR_STEPS if spec.mode == "major" else MINOR_STEPS
    progression = MAJOR_PROGRESSION if spec.mode == "major" else MINOR_PROGRESSION
    tonic = 48 + NOTE_NAMES.index(spec.root)  # MIDI note of the tonic, octave 3

    drums = np.zeros(total, np.float32)
    bass = np.zeros(total, np.float32)
    chords = np.zeros(total, np.float32)
    melody = np.zeros(total, np.float32)

    # Drum voices, built once. Kick: a 150 -> 45 Hz sine sweep; snare/hat: shaped noise.
    kick_n = int(0.25 * rate)
    kt = np.arange(kick_n) / rate
    kick = np.sin(2 * np.pi * np.cumsum(45 + 105 * np.exp(-kt * 30)) / rate)
    kick *= _envelope(kick_n, rate, 0.002, 0.09)
    snare_n = int(0.18 * rate)
    snare = rng.standard_normal(snare_n) * _envelope(snare_n, rate, 0.001, 0.05) * 0.5
    hat_n = int(0.05 * rate)
    hat = np.diff(rng.standard_normal(hat_n + 1)) * _envelope(hat_n, rate, 0.001, 0.012) * 0.15

    n_beats = int(np.ceil(spec.duration_s / beat))
    for b in range(n_beats):
        start = b * beat_n
        pos = b % spec.beats_per_bar
        if pos in (0, 2):
            _add(drums, start, kick)
        if pos in (1, 3):
            _add(drums, start, snare)
        _add(drums, start, hat)
        _add(drums, start + beat_n // 2, hat)

    bar_n = beat_n * spec.beats_per_bar
    n_bars = int(np.ceil(total / bar_n))
    pentatonic = [0, 2, 4, 7, 9] if spec.mode == "major" else [0, 3, 5, 7, 10]
    for bar in range(n_bars):
        degree = progression[bar % len(progression)]
        root = tonic + steps[degree]
        triad = [
            root + steps[(degree + k) % 7] - steps[degree] + 12 * ((degree + k) // 7)
            for k in (0, 2, 4)
        ]
        start = bar * bar_n
        t = np.arange(bar_n) / rate
        pad_env = _envelope(bar_n, rate, 0.05, 4.0)
        for note in triad:
            chords[start : start + bar_n] += (
                0.12 * np.sin(2 * np.pi * midi_to_hz(note + 12) * t) * pad_env
            )[: max(0, min(bar_n, total - start))]
        for b in range(spec.beats_per_bar):  # bass: root on every beat, octave below
            hz = midi_to_hz(root - 12)
            bt = np.arange(beat_n) / rate
            tone = np.sin(2 * np.pi * hz * bt) + 0.3 * np.sin(4 * np.pi * hz * bt)
            _add(bass, start + b * beat_n, 0.35 * tone * _envelope(beat_n, rate, 0.005, 0.3))
        for eighth in range(spec.beats_per_bar * 2):  # melody: eighth notes, some rests
            if rng.random() < 0.3:
                continue
            note = tonic + 24 + pentatonic[rng.integers(len(pentatonic))]
            n = beat_n // 2
            mt = np.arange(n) / rate
            tone = np.sin(2 * np.pi * midi_to_hz(note) * mt) * _envelope(n, rate, 0.01, 0.25)
            _add(melody, start + eighth * n, 0.2 * tone)

    left = drums + bass + 0.8 * chords + 1.2 * melody
    right = drums + bass + 1.2 * chords + 0.8 * melody
    stereo = np.stack([left, right]).astype(np.float32)
    peak = float(np.max(np.abs(stereo))) or 1.0
    return (stereo * (10 ** (-1 / 20) / peak)).astype(np.float32)
