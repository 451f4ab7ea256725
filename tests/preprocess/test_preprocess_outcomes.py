"""Awkward files through the whole plain path: each gets its documented outcome, failures are
recorded and the rest go on, failures are not retried until their file changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
from preprocess_support import new_dataset, snapshot, tone, write_tone

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.events import EventLog, LogEvent, ProgressEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.run import preprocess_dataset

EXPECTED_ERRORS = {
    "corrupt.wav": "cannot read audio",
    "empty.wav": "empty file (0 bytes)",
    "zero.wav": "no audio frames",
    "surround.wav": "6 channels: only mono or stereo is supported",
    "blip.wav": "too short",
}


def _folder(root: Path) -> Path:
    write_tone(root / "ok.wav", 0.3, 44100)
    write_tone(root / "mono8k.wav", 0.4, 8000, channels=1)
    write_tone(root / "long.flac", 30.0, 44100)  # cut to max_duration_s
    (root / "empty.wav").write_bytes(b"")
    (root / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEnot really audio" * 4)
    sf.write(str(root / "zero.wav"), np.zeros((0, 2)), 44100)
    sf.write(str(root / "surround.wav"), tone(0.2, 48000, channels=6), 48000)
    sf.write(str(root / "blip.wav"), tone(0.01, 48000), 48000)
    return root


def _write_dataset_json(storage: Storage, slug: str, source: Path) -> None:
    """A user-written dataset.json listing every file (a build would drop the unreadable ones,
    so this is how broken files reach preprocessing)."""
    samples = [
        {"audio_path": str(path), "filename": path.name, "caption": f"file {path.stem}"}
        for path in sorted(source.iterdir())
        if path.suffix in (".wav", ".flac")
    ]
    doc = {"metadata": {"custom_tag": "", "tag_position": "prepend"}, "samples": samples}
    storage.write_text(layout.dataset_json(slug), json.dumps(doc))


def test_each_awkward_file_gets_its_documented_outcome(tmp_path, tiny_ckpt) -> None:
    source = _folder(tmp_path / "songs")
    storage = Storage(tmp_path / "root")
    slug = new_dataset(storage, source, build=False)
    _write_dataset_json(storage, slug, source)
    events = []
    options = PreprocessOptions(max_duration_s=1.0)
    result = preprocess_dataset(storage, slug, options, tiny_ckpt, events=EventLog(events.append))

    assert result.total == 8 and result.processed == 3 and result.failed == 5
    tensor_dir = storage.local_path(layout.tensor_dir(slug, "acestep-v15-turbo"))
    meta = json.loads((tensor_dir / "preprocess_meta.json").read_text())
    by_name = {entry["rel_path"]: entry for entry in meta["samples"]}
    for name, message in EXPECTED_ERRORS.items():
        assert not by_name[name]["ok"] and message in by_name[name]["error"], by_name[name]
        assert by_name[name]["file"] is None
    mono, long, ok = by_name["mono8k.wav"], by_name["long.flac"], by_name["ok.wav"]
    assert ok["ok"] and ok["t_latent"] == 7  # 0.3 s -> 7 whole 40 ms frames
    assert (mono["source_channels"], mono["source_rate_hz"], mono["t_latent"]) == (1, 8000, 10)
    assert long["truncated"] and long["t_latent"] == 25 and long["source_duration_s"] == 30.0
    assert len(long["checksum"]) == 64
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert progress[-1].done == progress[-1].total == 8 and progress[-1].failed == 5
    warnings = [e.message for e in events if isinstance(e, LogEvent) and e.level == "warn"]
    assert len(warnings) == 5
    lines = (tensor_dir / "lm_codes.jsonl").read_text().splitlines()
    assert len(lines) == 3  # only good samples reach the LM

    # Unchanged failures are not retried; nothing is written.
    before = snapshot(tensor_dir)
    again = preprocess_dataset(storage, slug, options, tiny_ckpt)
    assert again.processed == 0 and again.failed == 5 and snapshot(tensor_dir) == before

    # Fixing a file (new size and mtime) redoes exactly that sample, which now succeeds.
    write_tone(source / "empty.wav", 0.2, 48000)
    fixed = preprocess_dataset(storage, slug, options, tiny_ckpt)
    assert fixed.processed == 1 and fixed.failed == 4
    assert fixed.written == [by_name["empty.wav"]["sample_id"]]
