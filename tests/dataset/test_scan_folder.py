"""Folder scans: which files become samples, what each sample holds, and the warnings."""

from __future__ import annotations

import functools
import pickle

import pytest

from hotstep_ray.audio.io import AudioInfo, probe_audio
from hotstep_ray.core.contracts import ScanPreview
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset import scan as scan_module
from hotstep_ray.dataset.ids import sample_id
from hotstep_ray.dataset.scan import probe_sample, scan_folder, scan_preview


def fake_probe(storage: Storage, key: str) -> AudioInfo:
    """Header probe stand-in, so rule tests need no real audio."""
    return AudioInfo(duration_s=12.5, sample_rate_hz=44100, channels=2, frames=551250)


def _touch(storage: Storage, *keys: str) -> None:
    for key in keys:
        storage.write_bytes(key, b"x")


def test_scan_rules(storage):
    _touch(
        storage,
        "a.WAV",
        "b/c.mp3",
        "b/c.flac",
        "b/c.ogg",
        "d.txt",
        ".hidden/e.wav",
        "._f.wav",
        "node_modules/g.wav",
        "z.aac",
    )
    result = scan_folder(storage, probe=fake_probe)
    assert [s.rel_path for s in result.samples] == ["a.WAV", "b/c.flac", "z.aac"]
    assert result.warnings == [
        "b/c.mp3 ignored: it shares the sidecar b/c.txt with b/c.flac",
        "b/c.ogg ignored: it shares the sidecar b/c.txt with b/c.flac",
        "Only 3 samples — 10+ recommended",
    ]
    flat = scan_folder(storage, recursive=False, probe=fake_probe)
    assert [s.rel_path for s in flat.samples] == ["a.WAV", "z.aac"]


def test_extension_priority_and_case_insensitive_stems(storage):
    _touch(storage, "s.mp3", "S.opus", "s.m4a", "t.aac", "t.ogg")
    result = scan_folder(storage, probe=fake_probe)
    assert [s.rel_path for s in result.samples] == ["s.m4a", "t.aac"]
    assert result.warnings[:3] == [
        "S.opus ignored: it shares the sidecar s.txt with s.m4a",
        "s.mp3 ignored: it shares the sidecar s.txt with s.m4a",
        "t.ogg ignored: it shares the sidecar t.txt with t.aac",
    ]


def test_sample_fields_from_sidecar_and_audio(storage, wav):
    audio = wav(0.5, 8000)
    storage.write_bytes("sub/song.wav", audio)
    storage.write_bytes(
        "sub/song.txt",
        b"caption: warm\ngenre: soul\nbpm: 92.6\nkey: A minor\nsignature: 4/4\nlanguage: en\n"
        b"trigger: zq\nrepeat: 3\nprompt_override: Genre\nlyrics:\nhello\n",
    )
    [sample] = scan_folder(storage).samples
    fields = ("caption", "lyrics", "genre", "bpm", "key", "signature", "language")
    assert sample.model_dump() == {
        "caption": "warm",
        "genre": "soul",
        "bpm": 92,
        "key": "A minor",
        "signature": "4/4",
        "language": "en",
        "is_instrumental": False,
        "lyrics": "hello",
        "custom_tag": "zq",
        "repeat": 3,
        "prompt_override": "genre",
        "sample_id": sample_id("sub/song.wav"),
        "rel_path": "sub/song.wav",
        "audio_path": storage.url_of("sub/song.wav"),
        "filename": "song.wav",
        "sidecar_path": storage.url_of("sub/song.txt"),
        "sidecar_exists": True,
        "file_missing": False,
        "excluded": False,
        "label_status": "labeled",
        "error": "",
        "has_audio_codes": False,
        "sources": {name: "sidecar" for name in fields},
        "duration": 0.5,
        "size_bytes": len(audio),
        "tag_artist": "",
        "tag_title": "",
        "tag_album": "",
        "labeled_at": "",
    }


def test_no_sidecar_gives_an_unlabeled_instrumental_sample(storage, wav):
    storage.write_bytes("x.wav", wav(0.25, 16000))
    [sample] = scan_folder(storage).samples
    assert (sample.caption, sample.lyrics, sample.is_instrumental) == ("", "", True)
    assert (sample.label_status, sample.sidecar_exists, sample.sources) == ("unlabeled", False, {})
    assert sample.duration == 0.25


def test_unreadable_audio_is_a_warning_not_a_failure(storage, wav):
    storage.write_bytes("bad.wav", b"not audio")
    storage.write_bytes("bad.txt", b"caption: c\nduration: 61.9\n")
    storage.write_bytes("good.wav", wav())
    result = scan_folder(storage)
    bad, good = result.samples
    assert bad.error.startswith(f"cannot read audio {storage.url_of('bad.wav')}: ")
    assert bad.duration == 61.0  # the sidecar's duration when the header cannot be read
    assert (good.error, good.duration) == ("", 0.5)
    assert result.warnings[0] == f"bad.wav: {bad.error}"
    assert result.warnings[1:] == ["Only 2 samples — 10+ recommended"]


def test_known_files_missing_from_disk(storage):
    _touch(storage, "a.wav")
    result = scan_folder(storage, probe=fake_probe, known_rel_paths=["A.wav", "gone/x.wav"])
    assert [(s.rel_path, s.file_missing) for s in result.samples] == [
        ("a.wav", False),
        ("gone/x.wav", True),
    ]
    assert result.warnings == [
        "Only 1 samples — 10+ recommended",
        "1 file(s) are missing from disk",
    ]


def test_enough_samples_and_the_scan_cap(storage, monkeypatch):
    _touch(storage, *(f"s{i:02d}.flac" for i in range(10)))
    assert scan_folder(storage, probe=fake_probe).warnings == []
    monkeypatch.setattr(scan_module, "MAX_SCAN_FILES", 4)
    capped = scan_folder(storage, probe=fake_probe)
    assert [s.rel_path for s in capped.samples] == ["s00.flac", "s01.flac", "s02.flac", "s03.flac"]
    assert capped.warnings == [
        "10 audio files found; only the first 4 are used",
        "Only 4 samples — 10+ recommended",
    ]


def test_map_fn_fans_out_picklable_work(storage, wav):
    storage.write_bytes("a.wav", wav())
    storage.write_bytes("b.wav", wav())
    calls: list[list[str]] = []

    def recording_map(func, items):
        items = list(items)
        calls.append(items)
        # What a process pool or Ray does: the function travels pickled.
        func = pickle.loads(pickle.dumps(func))
        return [func(item) for item in items]

    samples = scan_folder(storage, map_fn=recording_map).samples
    assert calls == [["a.wav", "b.wav"]]
    assert [s.duration for s in samples] == [0.5, 0.5]
    by_url = probe_sample(storage.url, "a.wav")  # a URL works as well as a Storage
    assert by_url == samples[0]
    assert pickle.loads(pickle.dumps(functools.partial(probe_sample, storage, probe=probe_audio)))


def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match="source folder not found: .*nope"):
        scan_folder(Storage(tmp_path / "nope"))
    with pytest.raises(InputError, match="source folder not found"):
        scan_preview(Storage(tmp_path / "nope"))


def test_scan_preview(storage):
    _touch(storage, "a.wav", "b.flac", "c.mp3", "c.wav", "dataset.json")
    storage.write_bytes("a.txt", b"caption: has one\n")
    storage.write_bytes("b.caption.txt", b"split caption\n")
    storage.write_bytes("c.txt", b"just lyrics\n")
    assert scan_preview(storage) == ScanPreview(
        root=storage.url,
        audio_files=3,
        with_sidecar=3,
        with_caption=2,
        has_dataset_json=True,
        extensions={".flac": 1, ".wav": 2},
        sample_names=["a.wav", "b.flac", "c.wav"],
        warnings=[
            "c.mp3 ignored: it shares the sidecar c.txt with c.wav",
            "Only 3 samples — 10+ recommended",
        ],
    )


def test_an_empty_file_says_empty_and_unreadable_files_are_not_counted(tmp_path):
    """`dataset build` on a folder with an empty and a corrupt file: each says what is wrong with
    it, and the "Only N samples" warning counts the one song that can be read."""
    import numpy as np

    from hotstep_ray.audio.io import encode_audio
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.dataset.scan import scan_folder

    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF....WAVEnot audio")
    tone = np.zeros((2, 4800), dtype=np.float32)
    (tmp_path / "good.wav").write_bytes(encode_audio(tone, 48_000, "WAV"))
    result = scan_folder(Storage(tmp_path))
    by_name = {s.rel_path: s for s in result.samples}
    assert "the file is empty (0 bytes)" in by_name["empty.wav"].error
    assert by_name["good.wav"].error == ""
    assert "Only 1 of 3 samples can be read — 10+ recommended" in result.warnings
