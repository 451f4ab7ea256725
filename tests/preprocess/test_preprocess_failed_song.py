"""A song that encoded once and fails on a rerun leaves the cache: its old tensors go with it, so
the trainers (which read every tensor file in the folder) train the songs the cache calls good,
and a crashed run's stray files go too."""

from __future__ import annotations

import json
import os

from preprocess_support import make_song_folder, new_dataset

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.run import preprocess_dataset


def test_a_song_that_fails_now_loses_its_old_tensors(tmp_path, tiny_ckpt):
    source = make_song_folder(tmp_path / "songs")
    storage = Storage(tmp_path / "root")
    slug = new_dataset(storage, source)
    options = PreprocessOptions(sidestep_pt=True)
    first = preprocess_dataset(storage, slug, options, tiny_ckpt)
    assert (first.processed, first.failed) == (3, 0)
    tensors = storage.local_path(f"tensors/{slug}/acestep-v15-turbo")
    meta = json.loads((tensors / "preprocess_meta.json").read_text())
    beta = next(e for e in meta["samples"] if e["rel_path"] == "beta.flac")
    assert (tensors / beta["file"]).is_file() and (tensors / beta["pt_file"]).is_file()

    # beta's audio is corrupted after it encoded; a crashed run left a stray file behind
    song = source / "beta.flac"
    song.write_bytes(b"fLaC not really")
    stamp = song.stat().st_mtime_ns + 5_000_000_000
    os.utime(song, ns=(stamp, stamp))
    (tensors / "ghost-0000.safetensors").write_bytes(b"left by a crash")

    again = preprocess_dataset(storage, slug, options, tiny_ckpt)
    assert (again.failed, again.cached) == (1, 2)
    meta = json.loads((tensors / "preprocess_meta.json").read_text())
    good = [e for e in meta["samples"] if e.get("ok")]
    on_disk = sorted(p.name for p in tensors.iterdir() if p.suffix in (".safetensors", ".pt"))
    assert on_disk == sorted(n for e in good for n in (e["file"], e["pt_file"]))
    assert not (tensors / beta["file"]).exists()
    codes = (tensors / "lm_codes.jsonl").read_text().splitlines()
    assert len(codes) == len(good) == 2
