"""Bad files fed to the label job: the analysis time limit, non-finite and silent audio, files
too short or with too many channels, unreadable files, and the bounds on tempo and key.

None of these needs Essentia: bad audio is refused before any extractor runs, a stand-in
analyzer (`isolation_fakes`) hangs where Essentia would, and the tempo/key bounds are checked
against a stubbed extractor.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import isolation_fakes as fakes
import numpy as np
import pytest
import soundfile as sf

from hotstep_ray.audio.synth import SongSpec
from hotstep_ray.core.contracts import CreateDatasetInput, LabelOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.ids import sample_id
from hotstep_ray.dataset.scan import probe_sample
from hotstep_ray.dataset.store import create_dataset, included_samples, read_labels
from hotstep_ray.labeling import analysis
from hotstep_ray.labeling.analysis import (
    KEY_STRENGTH_FLOOR,
    MAX_BPM,
    MIN_BPM,
    EssentiaAnalyzer,
    decode_for_analysis,
    signal_problem,
)
from hotstep_ray.labeling.captions import CaptionRequest, CaptionResult, OfflineCaptioner
from hotstep_ray.labeling.http import ProviderError
from hotstep_ray.labeling.isolation import (
    AnalysisTimeoutError,
    IsolatedWorker,
    WorkerCrashedError,
)
from hotstep_ray.labeling.job import label_dataset
from hotstep_ray.labeling.providers import Providers

RATE = 22_050
ALL = LabelOptions(scope="all", use_genius=False)


@dataclass
class RecordingCaptioner:
    """Captions every song it is asked about, and remembers which."""

    name: str = "recording"
    calls: list[str] = field(default_factory=list)

    def caption(self, request: CaptionRequest) -> CaptionResult:
        self.calls.append(request.rel_path)
        return CaptionResult({"caption": f"A song called {request.rel_path}."}, self.name)


def _tone(seconds: float, dbfs: float, channels: int = 2) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    wave = 10 ** (dbfs / 20) * np.sin(2 * np.pi * 440 * t)
    return np.repeat(wave[:, None], channels, axis=1).astype(np.float32)  # [T, C]


def _write(path: Path, frames: np.ndarray, subtype: str = "PCM_16") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, frames, RATE, subtype=subtype)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _dataset(root: Path) -> tuple[Storage, Path, str]:
    storage = Storage(root / "data")
    detail = create_dataset(storage, CreateDatasetInput(source_dir=str(root / "songs")))
    return storage, root / "songs", detail.slug


# -- the helper process ------------------------------------------------------------------------
def test_a_call_stuck_in_c_code_is_killed_at_its_limit_and_the_next_call_starts_fresh():
    worker = IsolatedWorker()
    try:
        first = worker.call(fakes.child_pid, (), 30)
        started = time.monotonic()
        with pytest.raises(AnalysisTimeoutError, match=r"^key analysis took longer than 0.3 s"):
            worker.call(fakes.never_returns, (), 0.3)
        # The limit, then a SIGKILL and the reap of the child: a second covers that on a loaded
        # 2-core box; a limit that did not bind would hang here (the call never returns).
        assert time.monotonic() - started < 0.3 + 1.0
        assert not _alive(first)
        assert worker.call(fakes.child_pid, (), 30) != first
    finally:
        worker.stop()


def test_errors_travel_back_and_a_crashed_child_is_replaced():
    worker = IsolatedWorker()
    try:
        first = worker.call(fakes.child_pid, (), 30)
        with pytest.raises(ValueError, match="bad input"):
            worker.call(fakes.refuses, (), 30)
        assert worker.call(fakes.child_pid, (), 30) == first  # an error is no reason to restart
        with pytest.raises(WorkerCrashedError, match=r"died during tempo analysis \(exit code -9"):
            worker.call(fakes.dies, (), 30)
        assert worker.call(fakes.child_pid, (), 30) != first
        with pytest.raises(ValueError, match="finite number of seconds"):
            worker.call(fakes.child_pid, (), 0)
        with pytest.raises(ValueError, match="finite number of seconds"):
            worker.call(fakes.child_pid, (), float("nan"))
    finally:
        worker.stop()


def test_a_sample_stuck_in_analysis_fails_with_the_reason_and_the_others_are_labeled(
    tmp_path, song_writer
):
    for name in ("a_hangs.wav", "b_fine.wav"):
        song_writer(tmp_path / "songs" / name, SongSpec("t", 120, "A", "major", 2.0, 1))
    storage, source, slug = _dataset(tmp_path)
    note = "no key written: the best match (A minor) has strength 0.10, under 0.5"
    analyzer = fakes.HangingAnalyzer(hang_on=("a_hangs.wav",), time_limit_s=0.3, notes=(note,))
    providers = Providers(analyzer, None, RecordingCaptioner())

    report = label_dataset(storage, slug, ALL, providers=providers)

    assert (report.labeled, report.failed) == (1, 1)
    error = report.errors[sample_id("a_hangs.wav")]
    assert error == "analysis: key analysis took longer than 0.3 s (the analysis time limit)"
    assert providers.captioner.calls == ["b_fine.wav"]  # nothing is asked about the stuck one
    assert sorted(p.name for p in source.glob("*.txt")) == ["b_fine.txt"]
    assert f"b_fine.wav: {note}" in report.warnings  # what the analysis left out is shown


# -- audio that cannot be labeled --------------------------------------------------------------
def test_non_finite_audio_is_refused_before_any_analyzer_with_preprocess_wording(tmp_path):
    frames = _tone(2.0, -6.0)
    frames[100, 0] = np.nan
    _write(tmp_path / "nan.wav", frames, subtype="FLOAT")
    with pytest.raises(InputError, match=r"^decoded audio contains NaN or Inf$"):
        decode_for_analysis(Storage(tmp_path), "nan.wav")
    mono = _tone(2.0, -6.0, channels=1)[:, 0]
    mono[5] = np.inf
    # Refused before Essentia is even loaded: its key extractor never returns on such input.
    with pytest.raises(InputError, match="NaN or Inf"):
        EssentiaAnalyzer().analyze_signal(mono)


@pytest.mark.parametrize(
    ("dbfs", "problem"),
    [
        (None, "silent: every sample is zero"),
        (-70.0, "silent: the loudest sample is at -70.0 dBFS (under -60)"),
        (-50.0, ""),  # quiet, but 10 dB over the floor
    ],
)
def test_silence_is_the_peak_of_every_channel_under_the_floor(dbfs, problem):
    frames = np.zeros((RATE, 2), np.float32) if dbfs is None else _tone(1.0, dbfs)
    assert signal_problem(frames.T) == problem


def test_out_of_phase_channels_are_not_silence():
    frames = _tone(1.0, -6.0)
    frames[:, 1] *= -1  # cancels to zero in the mono downmix the analyzers read
    assert signal_problem(frames.T) == ""


def test_unusable_files_fail_with_a_one_line_reason_and_get_no_sidecar(tmp_path):
    songs = tmp_path / "songs"
    songs.mkdir()
    (songs / "empty.wav").write_bytes(b"")
    (songs / "noise.wav").write_bytes(np.random.default_rng(0).bytes(4000))
    _write(songs / "silent.wav", np.zeros((2 * RATE, 2), np.float32))
    _write(songs / "short.wav", _tone(0.2, -6.0))
    _write(songs / "six.wav", _tone(2.0, -6.0, channels=6))
    nan = _tone(2.0, -6.0)
    nan[10, 1] = np.nan
    _write(songs / "nan.wav", nan, subtype="FLOAT")
    storage, source, slug = _dataset(tmp_path)
    captioner = RecordingCaptioner()

    report = label_dataset(
        storage, slug, ALL, providers=Providers(EssentiaAnalyzer(), None, captioner)
    )

    reasons = {
        "empty.wav": "the file is empty (0 bytes)",
        "noise.wav": "Format not recognised",
        "silent.wav": "silent: every sample is zero",
        "short.wav": "too short to label: 0.20 s (under 1.5 s, one beat at 40 BPM)",
        "six.wav": "6 channels: only mono or stereo is supported; downmix to stereo first",
        "nan.wav": "decoded audio contains NaN or Inf",
    }
    assert (report.labeled, report.failed) == (0, len(reasons))
    for name, reason in reasons.items():
        error = report.errors[sample_id(name)]
        assert error.startswith("analysis: ") and reason in error and "\n" not in error
    assert captioner.calls == []
    assert list(source.glob("*.txt")) == []  # no sidecar, not even `language: en`
    records = read_labels(storage, slug)
    assert {r["labelStatus"] for r in records.values()} == {"error"}
    assert not any(r.get("essentia") for r in records.values())  # no made-up analysis either


def test_without_essentia_the_header_alone_refuses_what_it_can(tmp_path):
    songs = tmp_path / "songs"
    songs.mkdir()
    (songs / "empty.wav").write_bytes(b"")
    _write(songs / "short.wav", _tone(0.2, -6.0))
    _write(songs / "six.wav", _tone(2.0, -6.0, channels=6))
    _write(songs / "fine.wav", _tone(2.0, -6.0))
    storage, source, slug = _dataset(tmp_path)
    captioner = RecordingCaptioner()

    report = label_dataset(storage, slug, ALL, providers=Providers(None, None, captioner))

    assert (report.labeled, report.failed) == (1, 3)
    assert captioner.calls == ["fine.wav"]
    assert [p.name for p in source.glob("*.txt")] == ["fine.txt"]


def test_a_six_channel_file_is_flagged_at_scan_time_with_the_downmix(tmp_path):
    _write(tmp_path / "surround mix.wav", _tone(2.0, -6.0, channels=6))
    sample = probe_sample(Storage(tmp_path), "surround mix.wav")
    assert sample.error.startswith("6 channels: only mono or stereo is supported")
    assert "`ffmpeg -i 'surround mix.wav' -ac 2 'surround mix-stereo.wav'`" in sample.error
    assert sample.duration == pytest.approx(2.0)  # still described, just not trainable
    assert included_samples([sample]) == []  # so the build leaves it out


def test_the_offline_captioner_says_why_there_is_no_analysis():
    request = CaptionRequest(sample_id="x", analysis_error="decoded audio contains NaN or Inf")
    with pytest.raises(ProviderError) as failure:
        OfflineCaptioner().caption(request)
    assert str(failure.value).endswith(": decoded audio contains NaN or Inf")
    assert "enable Essentia" not in str(failure.value)


# -- bounds on what the analysis reports -------------------------------------------------------
def _stub_essentia(monkeypatch, bpm: float, key: tuple[str, str, float]) -> None:
    es = SimpleNamespace(
        RhythmExtractor2013=lambda **_: lambda mono: (bpm, [], 0.0, [], []),
        KeyExtractor=lambda **_: lambda mono: key,
    )
    monkeypatch.setattr(analysis, "essentia_standard", lambda: es)


@pytest.mark.parametrize(
    ("bpm_raw", "bpm"),
    [
        (738.3, None),  # the tempo the all-silent file was given
        (MIN_BPM - 0.6, None),
        (MIN_BPM - 0.5, MIN_BPM),  # rounds half-up onto the range's edge
        (120.2, 120),
        (MAX_BPM + 0.4, MAX_BPM),
        (MAX_BPM + 0.5, None),
    ],
)
def test_a_tempo_outside_essentias_range_is_not_written(monkeypatch, bpm_raw, bpm):
    _stub_essentia(monkeypatch, bpm_raw, ("A", "major", 0.9))
    features = EssentiaAnalyzer().analyze_signal(_tone(2.0, -6.0, channels=1)[:, 0])
    assert features.bpm == bpm and features.bpm_raw == bpm_raw
    assert features.to_record()["bpm"] == bpm
    notes = [n for n in features.notes if n.startswith("no tempo written")]
    assert len(notes) == (bpm is None)


@pytest.mark.parametrize(
    ("strength", "keyscale"),
    [(0.0, ""), (KEY_STRENGTH_FLOOR - 0.01, ""), (KEY_STRENGTH_FLOOR, "A minor"), (0.8, "A minor")],
)
def test_a_weak_key_is_not_written(monkeypatch, strength, keyscale):
    _stub_essentia(monkeypatch, 120.0, ("A", "minor", strength))
    features = EssentiaAnalyzer().analyze_signal(_tone(2.0, -6.0, channels=1)[:, 0])
    assert features.keyscale == keyscale
    assert features.key_strength == strength  # kept in the record for whoever wants to look
    assert any(n.startswith("no key written") for n in features.notes) == (not keyscale)
    assert analysis.AudioFeatures.from_record(features.to_record()).notes == features.notes


def test_the_time_limit_flag_reaches_the_analyzer() -> None:
    from hotstep_ray.cli.label_cmd import _options
    from hotstep_ray.core.contracts import ANALYSIS_TIME_LIMIT_S
    from hotstep_ray.labeling.analysis import essentia_available
    from hotstep_ray.labeling.providers import resolve_providers

    assert _options({"analysis_time_limit_s": None}).analysis_time_limit_s == ANALYSIS_TIME_LIMIT_S
    options = _options({"analysis_time_limit_s": "7.5"})  # the flag's text
    assert options.analysis_time_limit_s == 7.5
    if not essentia_available():
        pytest.skip("Essentia is not installed: no analyzer to carry the limit")
    providers, _ = resolve_providers(options, {})
    assert providers.analyzer.time_limit_s == 7.5
