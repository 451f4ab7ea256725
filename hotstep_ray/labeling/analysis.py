"""Pass A: BPM and key with Essentia, plus descriptors for the offline captioner, cached per file.

Each song is decoded once (soundfile), downmixed to mono and resampled to 44.1 kHz — what
Essentia's extractors are tuned for — and every analyzer reads that one signal. Tags come from the
same open file. The result is cached in the label record next to the file's size and mtime, so a
relabel of an unchanged file does no audio work at all.

Before any analyzer runs, the decoded audio must be usable: readable, mono or stereo, finite (no
NaN or Inf sample), at least `MIN_DURATION_S` long and not silent. A file that fails is refused
with the reason (`InputError`), and no analysis values are made up for it. Results outside what
the extractors can honestly report (a tempo outside `MIN_BPM`..`MAX_BPM`, a key weaker than
`KEY_STRENGTH_FLOOR`) are left out, with a note saying why.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import soundfile as sf

from hotstep_ray.audio.channels import to_mono
from hotstep_ray.audio.resample import resample
from hotstep_ray.core.contracts import ANALYSIS_TIME_LIMIT_S
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.audio_prep import ANALYSIS_RATE_HZ, essentia_standard
from hotstep_ray.labeling.descriptors import describe
from hotstep_ray.labeling.tags import clean_tags

# Bump when the analysis changes meaning, so cached records are recomputed. 2: sanity bounds on
# tempo and key, unusable audio refused.
ANALYSIS_VERSION = 2
# The widest tempo range Essentia's RhythmExtractor2013 can be asked to track: its parameters take
# minTempo >= 40 and maxTempo <= 250 BPM (essentia.upf.edu/reference/std_RhythmExtractor2013.html).
# The `degara` tracker does not clamp to them, and an estimate outside them comes from a signal
# with no pulse (silence, a lone click), so it is not written.
MIN_BPM, MAX_BPM = 40, 250
# KeyExtractor's strength is the Pearson correlation between the song's 12-bin pitch-class profile
# and the best key template (Essentia's tonal/key.cpp). Over 12 bins chance alone reaches 0.5
# about one time in twenty (the one-tailed 5% critical r for n = 12 is 0.497), so a weaker match
# writes no key.
KEY_STRENGTH_FLOOR = 0.5
# Shorter than one beat at the slowest tempo reported (60 / MIN_BPM seconds), a file holds no tempo
# to measure and too little music to describe: it is refused rather than labeled from guesses.
MIN_DURATION_S = 60.0 / MIN_BPM
# A file whose loudest sample stays under -60 dBFS is silent: the same default noise floor ffmpeg's
# `silencedetect` uses to call audio silence.
SILENCE_PEAK_DBFS = -60.0
NON_FINITE = "decoded audio contains NaN or Inf"  # preprocess's wording (preprocess/audio_prep.py)

Stage = Callable[[str], None]


def _no_stage(name: str) -> None:
    return None


@dataclass(frozen=True)
class FileStamp:
    """Size and modification time: together, "this file has not changed since"."""

    size_bytes: int
    mtime_ms: int

    def to_record(self, seconds: float) -> dict[str, Any]:
        # HOT-Step's `durationCache` shape, so a record is readable by either tool.
        return {
            "seconds": round(seconds, 3),
            "sizeBytes": self.size_bytes,
            "mtimeMs": self.mtime_ms,
        }

    def matches(self, cache: Any) -> bool:
        return (
            isinstance(cache, dict)
            and cache.get("sizeBytes") == self.size_bytes
            and cache.get("mtimeMs") == self.mtime_ms
        )


def file_stamp(storage: Storage, key: str) -> FileStamp:
    return FileStamp(storage.size(key), storage.mtime_ns(key) // 1_000_000)


@dataclass(frozen=True)
class AudioFeatures:
    """What Pass A learned about one song."""

    duration_s: float
    bpm: int | None = None  # rounded half-up, as the seed's Math.round
    bpm_raw: float = 0.0
    key: str = ""  # tonic as Essentia spells it: "A", "C#", "Bb"
    scale: str = ""  # "major" | "minor"
    key_strength: float = 0.0
    descriptors: dict[str, float] = field(default_factory=dict)
    method: str = ""
    profile: str = ""
    version: int = ANALYSIS_VERSION
    notes: tuple[str, ...] = ()  # why a value was left out (tempo out of range, weak key)

    @property
    def keyscale(self) -> str:
        """ "C minor" — the sidecar's key format."""
        return f"{self.key} {self.scale}" if self.key and self.scale else ""

    def to_record(self) -> dict[str, Any]:
        """The label store's `essentia` object (HOT-Step's bpm/key/scale/loudness/danceability
        keys first, then ours, camelCase)."""
        d = self.descriptors
        return {
            "bpm": self.bpm,
            "key": self.key,
            "scale": self.scale,
            "loudness": d.get("loudness_db"),
            "danceability": d.get("danceability"),
            "bpmRaw": round(self.bpm_raw, 3),
            "keyStrength": round(self.key_strength, 4),
            "durationS": round(self.duration_s, 3),
            "descriptors": dict(d),
            "method": self.method,
            "profile": self.profile,
            "version": self.version,
            "notes": list(self.notes),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AudioFeatures:
        return cls(
            duration_s=float(record.get("durationS") or 0.0),
            bpm=record.get("bpm"),
            bpm_raw=float(record.get("bpmRaw") or 0.0),
            key=record.get("key") or "",
            scale=record.get("scale") or "",
            key_strength=float(record.get("keyStrength") or 0.0),
            descriptors=dict(record.get("descriptors") or {}),
            method=record.get("method") or "",
            profile=record.get("profile") or "",
            version=int(record.get("version") or 0),
            notes=tuple(str(n) for n in record.get("notes") or ()),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DecodedSong:
    mono: np.ndarray  # float32 at ANALYSIS_RATE_HZ
    duration_s: float  # of the whole file, not just the decoded part
    tags: dict[str, str]


def _open(storage: Storage, key: str):
    # Local files by path (no copy); remote ones are fetched once into memory.
    return str(storage.local_path(key)) if storage.is_local else io.BytesIO(storage.read_bytes(key))


def _refuse_empty(storage: Storage, key: str) -> None:
    if storage.size(key) == 0:  # libsndfile would call it "Format not recognised"
        raise InputError(f"cannot read audio {storage.url_of(key)}: the file is empty (0 bytes)")


def header_problem(key: str, channels: int, duration_s: float) -> str:
    """Why a file cannot be labeled, from its header alone ("" when it can)."""
    if channels not in (1, 2):
        # Imported here: the scan's module pulls in the contracts, which the analysis process
        # would otherwise load on every start for a check that rarely fires.
        from hotstep_ray.dataset.scan import channel_problem

        return channel_problem(channels, key)
    if duration_s < MIN_DURATION_S:
        return (
            f"too short to label: {duration_s:.2f} s (under {MIN_DURATION_S:g} s, one beat at "
            f"{MIN_BPM} BPM)"
        )
    return ""


def signal_problem(data: np.ndarray) -> str:
    """Why decoded `[C, T]` (or `[T]`) audio cannot be analysed ("" when it can): a NaN or Inf
    sample (Essentia's key extractor never returns on one), or silence on every channel."""
    if not np.all(np.isfinite(data)):
        return NON_FINITE
    peak = float(np.max(np.abs(data))) if data.size else 0.0
    if peak == 0.0:
        return "silent: every sample is zero"
    peak_db = 20.0 * math.log10(peak)
    if peak_db < SILENCE_PEAK_DBFS:
        return f"silent: the loudest sample is at {peak_db:.1f} dBFS (under {SILENCE_PEAK_DBFS:g})"
    return ""


def decode_for_analysis(storage: Storage, key: str, max_duration_s: float = 0.0) -> DecodedSong:
    """Tags, full duration and mono 44.1 kHz audio of one file, from a single open. Raises
    `InputError` for a file that cannot be labeled (`header_problem`, `signal_problem`)."""
    _refuse_empty(storage, key)
    problem, data = "", None
    try:
        with sf.SoundFile(_open(storage, key)) as handle:
            rate, frames = handle.samplerate, handle.frames
            tags = clean_tags(handle.copy_metadata())
            # Checked before decoding: a long multichannel file is refused without reading it.
            problem = header_problem(key, handle.channels, frames / float(rate))
            if not problem:
                wanted = min(frames, int(max_duration_s * rate)) if max_duration_s > 0 else frames
                data = handle.read(wanted, dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile raises RuntimeError subclasses for unknown formats
        raise InputError(f"cannot decode audio {storage.url_of(key)}: {exc}") from exc
    # Before the downmix: out-of-phase channels cancel in mono but are not silence.
    problem = problem or signal_problem(data)
    if problem:
        raise InputError(problem)
    mono = resample(to_mono(data.T), int(rate), ANALYSIS_RATE_HZ)
    return DecodedSong(mono, frames / float(rate), tags)


def read_tags(storage: Storage, key: str) -> tuple[dict[str, str], float]:
    """Tags and duration from the header only (when Essentia is off there is no decode). Raises
    `InputError` for a file whose header already says it cannot be labeled."""
    _refuse_empty(storage, key)
    try:
        with sf.SoundFile(_open(storage, key)) as handle:
            tags, channels = clean_tags(handle.copy_metadata()), handle.channels
            duration = handle.frames / float(handle.samplerate)
    except Exception as exc:
        raise InputError(f"cannot read audio {storage.url_of(key)}: {exc}") from exc
    if problem := header_problem(key, channels, duration):
        raise InputError(problem)
    return tags, duration


def round_bpm(bpm: float) -> int | None:
    """Half-up rounding (JavaScript's Math.round, which the seed uses); 0 means "no tempo"."""
    rounded = int(math.floor(bpm + 0.5)) if bpm and math.isfinite(bpm) else 0
    return rounded if rounded > 0 else None


def essentia_available() -> bool:
    try:
        essentia_standard()
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class EssentiaAnalyzer:
    """BPM (RhythmExtractor2013), key (KeyExtractor) and descriptors of a song.

    `time_limit_s` bounds one song's analysis when it runs through `analyze_file` in a helper
    process (`isolation`), as the label job does.

    `degara` is the default rhythm method: on steady music it lands within 0.1 BPM of
    `multifeature` at a quarter of the cost (0.7 vs 2.9 CPU-s on a 4-minute song). `edma` is the
    key profile the seed reads (`tonal.key_edma`). Songs longer than `max_duration_s` are analysed
    on their first `max_duration_s` seconds, which bounds memory and time for DJ mixes.
    """

    rhythm_method: str = "degara"
    key_profile: str = "edma"
    max_duration_s: float = 600.0
    time_limit_s: float = ANALYSIS_TIME_LIMIT_S

    def analyze_signal(
        self, mono: np.ndarray, duration_s: float | None = None, stage: Stage = _no_stage
    ) -> AudioFeatures:
        """Tempo, key and descriptors of mono 44.1 kHz audio; `stage` is told each step's name
        as it starts (for a timeout message). Refuses non-finite audio: Essentia's key extractor
        never returns on a NaN sample."""
        mono = np.ascontiguousarray(mono, dtype=np.float32)
        if not np.all(np.isfinite(mono)):
            raise InputError(NON_FINITE)
        es = essentia_standard()
        seconds = duration_s if duration_s is not None else len(mono) / ANALYSIS_RATE_HZ
        if len(mono) < ANALYSIS_RATE_HZ:  # under a second: no tempo or key worth reporting
            return AudioFeatures(seconds, method=self.rhythm_method, profile=self.key_profile)
        notes: list[str] = []
        stage("tempo analysis")
        bpm_raw = float(es.RhythmExtractor2013(method=self.rhythm_method)(mono)[0])
        bpm = round_bpm(bpm_raw)
        if bpm is not None and not MIN_BPM <= bpm <= MAX_BPM:
            notes.append(
                f"no tempo written: the estimate ({bpm_raw:.1f} BPM) is outside "
                f"{MIN_BPM}-{MAX_BPM} BPM"
            )
            bpm = None
        stage("key analysis")
        key, scale, strength = es.KeyExtractor(
            profileType=self.key_profile, sampleRate=ANALYSIS_RATE_HZ
        )(mono)
        key, scale, strength = str(key), str(scale).lower(), float(strength)
        if strength < KEY_STRENGTH_FLOOR:
            notes.append(
                f"no key written: the best match ({key} {scale}) has strength {strength:.2f}, "
                f"under {KEY_STRENGTH_FLOOR:g}"
            )
            key = scale = ""
        stage("descriptors")
        return AudioFeatures(
            duration_s=seconds,
            bpm=bpm,
            bpm_raw=bpm_raw,
            key=key,
            scale=scale,
            key_strength=strength,
            descriptors=describe(mono, ANALYSIS_RATE_HZ, bpm),
            method=self.rhythm_method,
            profile=self.key_profile,
            notes=tuple(notes),
        )

    def analyze(
        self, storage: Storage, key: str, stage: Stage = _no_stage
    ) -> tuple[AudioFeatures, dict[str, str]]:
        """Decode `key` once, check it is usable, and analyse it; returns (features, tags)."""
        stage("decoding")
        song = decode_for_analysis(storage, key, self.max_duration_s)
        return self.analyze_signal(song.mono, song.duration_s, stage), song.tags

    def cached(self, record: dict[str, Any], stamp: FileStamp) -> AudioFeatures | None:
        """The features stored in a label record, if they describe this exact file and were made
        by this analysis (same version, method and profile)."""
        stored = record.get("essentia")
        if not isinstance(stored, dict) or not stamp.matches(record.get("durationCache")):
            return None
        features = AudioFeatures.from_record(stored)
        same = (features.version, features.method, features.profile) == (
            ANALYSIS_VERSION,
            self.rhythm_method,
            self.key_profile,
        )
        return features if same else None


def analyze_file(
    analyzer: EssentiaAnalyzer, source_url: str, key: str, stage: Stage = _no_stage
) -> tuple[AudioFeatures, dict[str, str]]:
    """`analyzer.analyze` of `key` under the folder `source_url`, in a form `isolation` can send
    to its helper process (a module-level function of picklable arguments)."""
    return analyzer.analyze(Storage(source_url), key, stage)
