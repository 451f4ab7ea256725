"""Dataset records, label store, sample edits and the dataset.json build, on disk and in memory."""

from __future__ import annotations

import json

import pytest

from hotstep_ray.core.contracts import BuildOptions, CreateDatasetInput, PatchSampleInput
from hotstep_ray.core.errors import InputError, PathNotAllowedError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.ids import sample_id
from hotstep_ray.dataset.sidecar import parse_sidecar_bytes
from hotstep_ray.dataset.store import (
    build_dataset,
    create_dataset,
    list_datasets,
    load_dataset,
    patch_label,
    patch_sample,
    read_label,
    update_dataset,
)


def _songs(storage: Storage, wav, folder: str = "songs") -> Storage:
    source = storage.child(folder)
    source.write_bytes("a.wav", wav(1.5))
    source.write_bytes("a.txt", b"caption: first song\nbpm: 100\n")
    source.write_bytes("sub/b.wav", wav(0.25))
    return source


def _create(storage: Storage, source: Storage, **options):
    return create_dataset(storage, CreateDatasetInput(source_dir=source.url, **options))


def test_create_load_and_list(storage, wav):
    source = _songs(storage, wav)
    detail = _create(storage, source, name="My Band!", default_language="English")
    assert (detail.slug, detail.name, detail.source_dir) == ("my-band", "My Band!", source.url)
    assert (detail.default_language, detail.status) == ("en", "draft")
    assert (detail.sample_count, detail.labeled_count, detail.excluded_count) == (2, 1, 0)
    assert [s.rel_path for s in detail.samples] == ["a.wav", "sub/b.wav"]
    assert detail.warnings == ["Only 2 samples — 10+ recommended"]
    record = storage.read_json("datasets/my-band/dataset_meta.json")
    assert (record["sourceDir"], record["sampleCount"], record["defaultLanguage"]) == (
        source.url,
        2,
        "en",
    )
    assert "samples" not in record
    loaded = load_dataset(storage, "my-band")
    assert loaded.samples == detail.samples
    assert [s.slug for s in list_datasets(storage)] == ["my-band"]


def test_slugs_are_unique_and_a_folder_has_one_dataset(storage, wav):
    slugs = [_create(storage, _songs(storage, wav, f"f{i}"), name="Band").slug for i in range(3)]
    assert slugs == ["band", "band-2", "band-3"]
    with pytest.raises(InputError, match="already has a dataset: 'band'"):
        _create(storage, storage.child("f0"))
    assert _create(storage, _songs(storage, wav, "Unnamed Folder")).slug == "unnamed-folder"


def test_create_refuses_a_missing_or_empty_folder(storage):
    with pytest.raises(InputError, match="source folder not found"):
        _create(storage, storage.child("nope"))
    storage.child("empty").write_bytes("notes.txt", b"x")
    with pytest.raises(InputError, match="no audio files in"):
        _create(storage, storage.child("empty"))


def test_settings_seeded_from_an_existing_dataset_json(storage, wav):
    source = _songs(storage, wav)
    meta = {"custom_tag": "zq", "tag_position": "append", "genre_ratio": 30, "name": "x"}
    source.write_text("dataset.json", json.dumps({"metadata": meta, "samples": []}))
    detail = _create(storage, source, custom_tag="")  # given explicitly: not seeded
    assert (detail.custom_tag, detail.tag_position, detail.genre_ratio) == ("", "append", 30)


def test_build_writes_dataset_json_and_keeps_unknown_keys(storage, wav):
    source = _songs(storage, wav)
    _create(storage, source, name="band", custom_tag="zq")
    path = build_dataset(storage, "band")
    assert path == storage.url_of("datasets/band/dataset.json")
    doc = storage.read_json("datasets/band/dataset.json")
    assert doc["metadata"]["num_samples"] == 2
    assert [
        (s["filename"], s["caption"], s["custom_tag"], s["duration"]) for s in doc["samples"]
    ] == [
        ("a.wav", "first song", "zq", 1),
        ("b.wav", "b", "zq", 0),
    ]
    summary = load_dataset(storage, "band")
    assert (summary.status, summary.dataset_json_path) == ("built", path)
    assert summary.built_at
    # A user edits the file; a rebuild keeps what it does not own.
    doc["metadata"]["created_at"] = "2020-01-01T00:00:00"
    doc["metadata"]["comment"] = "keep me"
    doc["samples"][1]["mood"] = "calm"
    storage.write_text("datasets/band/dataset.json", json.dumps(doc))
    build_dataset(storage, "band")
    again = storage.read_json("datasets/band/dataset.json")
    assert again["metadata"]["created_at"] == "2020-01-01T00:00:00"
    assert again["metadata"]["comment"] == "keep me"
    assert again["samples"][1]["mood"] == "calm"


def test_build_output_paths(storage, wav, tmp_path):
    source = _songs(storage, wav)
    _create(storage, source, name="band")
    inside = build_dataset(storage, "band", BuildOptions(output_path=source.url_of("x.json")))
    assert inside == source.url_of("x.json") and source.exists("x.json")
    as_folder = build_dataset(storage, "band", BuildOptions(output_path=source.url_of("sub")))
    assert as_folder == source.url_of("sub/dataset.json")
    in_root = build_dataset(storage, "band", BuildOptions(output_path=storage.url_of("o.json")))
    assert in_root == storage.url_of("o.json")
    outside = str(tmp_path / "elsewhere.json") if storage.is_local else "memory:///other/x.json"
    with pytest.raises(PathNotAllowedError, match="is outside the source folder"):
        build_dataset(storage, "band", BuildOptions(output_path=outside))
    escape = source.url_of("sub") + "/../../../etc.json"
    with pytest.raises(PathNotAllowedError):
        build_dataset(storage, "band", BuildOptions(output_path=escape))


def test_build_refuses_to_replace_a_broken_file(storage, wav):
    _create(storage, _songs(storage, wav), name="band")
    storage.write_text("datasets/band/dataset.json", "{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        build_dataset(storage, "band")
    assert storage.read_text("datasets/band/dataset.json") == "{not json"


def test_build_leaves_out_excluded_missing_and_unreadable_files(storage, wav):
    source = _songs(storage, wav)
    source.write_bytes("c.wav", b"broken")
    _create(storage, source, name="band")
    patch_sample(storage, "band", sample_id("a.wav"), PatchSampleInput(excluded=True))
    build_dataset(storage, "band")
    doc = storage.read_json("datasets/band/dataset.json")
    assert [s["filename"] for s in doc["samples"]] == ["b.wav"]
    source.delete("sub/b.wav")
    with pytest.raises(InputError, match="nothing to build"):
        build_dataset(storage, "band")


def test_label_store_shallow_merge(storage):
    patch_label(storage, "band", "0123456789abcdef", {"sources": {"caption": "llm"}, "error": "x"})
    merged = patch_label(
        storage, "band", "0123456789abcdef", {"sources": {"genre": "essentia"}, "error": ""}
    )
    assert merged == {
        "sampleId": "0123456789abcdef",
        "sources": {"caption": "llm", "genre": "essentia"},
        "error": "",
    }
    assert read_label(storage, "band", "0123456789abcdef") == merged
    assert read_label(storage, "band", "fedcba9876543210") == {}


def test_patch_sample_writes_the_sidecar_and_the_label_store(storage, wav):
    source = _songs(storage, wav)
    source.write_bytes("a.txt", b"caption: first song\ntrigger: trg\nlyrics:\nla\n")
    _create(storage, source, name="band")
    sid = sample_id("a.wav")
    sample = patch_sample(storage, "band", sid, PatchSampleInput(caption="new", bpm=120))
    assert (sample.caption, sample.bpm, sample.lyrics, sample.custom_tag) == (
        "new",
        120,
        "la",
        "trg",
    )
    assert sample.sources == {"caption": "user", "bpm": "user", "lyrics": "sidecar"}
    assert source.read_bytes("a.txt.bak") == b"caption: first song\ntrigger: trg\nlyrics:\nla\n"
    assert source.read_bytes("a.txt") == (
        b"caption: new\ngenre: \nbpm: 120\nkey: \nsignature: \nis_instrumental: \n"
        b"trigger: trg\nlyrics:\nla\n"
    )
    assert read_label(storage, "band", sid) == {
        "sampleId": sid,
        "relPath": "a.wav",
        "sources": {"caption": "user", "bpm": "user"},
    }
    # Clearing a field is explicit: a field set to None is written empty.
    first_edit = source.read_bytes("a.txt")
    patch_sample(storage, "band", sid, PatchSampleInput(bpm=None, is_instrumental=True))
    fields = parse_sidecar_bytes(source.read_bytes("a.txt"))
    assert (fields["bpm"], fields["is_instrumental"], fields["caption"]) == ("", "true", "new")
    # The second edit keeps the user's original in .bak and the first edit in .bak.1.
    assert source.read_bytes("a.txt.bak") == b"caption: first song\ntrigger: trg\nlyrics:\nla\n"
    assert source.read_bytes("a.txt.bak.1") == first_edit


def test_missing_file_after_labeling(storage, wav):
    source = _songs(storage, wav)
    _create(storage, source, name="band")
    sid = sample_id("sub/b.wav")
    patch_sample(storage, "band", sid, PatchSampleInput(genre="pop"))
    source.delete("sub/b.wav")
    detail = load_dataset(storage, "band")
    assert [(s.rel_path, s.file_missing) for s in detail.samples] == [
        ("a.wav", False),
        ("sub/b.wav", True),
    ]
    assert detail.warnings == [
        "Only 1 samples — 10+ recommended",
        "1 file(s) are missing from disk",
    ]
    with pytest.raises(InputError, match="missing from disk"):
        patch_sample(storage, "band", sid, PatchSampleInput(genre="rock"))
    with pytest.raises(InputError, match="no sample"):
        patch_sample(storage, "band", "0000000000000000", PatchSampleInput(genre="rock"))


def test_update_dataset(storage, wav):
    _create(storage, _songs(storage, wav), name="band")
    updated = update_dataset(storage, "band", {"custom_tag": "zq", "default_language": "French"})
    assert (updated.custom_tag, updated.default_language) == ("zq", "fr")
    with pytest.raises(InputError, match="cannot change"):
        update_dataset(storage, "band", {"source_dir": "/elsewhere"})
    with pytest.raises(ValueError):
        update_dataset(storage, "band", {"tag_position": "sideways"})
    with pytest.raises(InputError, match="no dataset 'nope'"):
        load_dataset(storage, "nope")
