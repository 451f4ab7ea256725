"""dataset.json against Side-Step's recorded preprocessing (tests/fixtures/sidestep/dataset_json.json),
and our builder's output and round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotstep_ray.core.contracts import DatasetSummary, Sample
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.dataset_json import (
    build_dataset_json,
    dumps_dataset_json,
    load_dataset_metadata,
    normalize_keyscale,
    normalize_language,
    normalize_timesignature,
    plan_preprocess,
    select_genre_indices,
    split_dataset_json,
)

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sidestep" / "dataset_json.json").read_text("utf-8")
)
CASES = {case["name"]: case for case in FIXTURE["cases"]}


def _with_dir(value, storage: Storage):
    """The fixture with `<dataset_dir>` replaced by the folder the JSON sits in."""
    return json.loads(json.dumps(value).replace("<dataset_dir>", storage.url))


def _plan(storage: Storage, case: dict):
    for name in case["files_on_disk"]:
        storage.write_bytes(name, b"")
    storage.write_text("dataset.json", case["dataset_json_text"])
    return plan_preprocess(storage, "dataset.json", **case["caller_overrides"])


def test_fixture_counts():
    assert len(CASES) == 5
    assert sum(len(c["per_file"]) for c in CASES.values()) == 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_discovery_and_metadata(storage, name):
    case = CASES[name]
    plan = _plan(storage, case)
    assert plan.files == _with_dir(case["discovered_files_sorted"], storage)
    assert plan.dataset_metadata == case["load_dataset_metadata"]
    assert plan.effective_metadata == case["effective_dataset_metadata"]
    assert plan.genre_indices == case["genre_indices"]
    assert sorted(plan.sample_meta) == sorted(_with_dir(case["sample_meta_keys"], storage))


@pytest.mark.parametrize("name", sorted(CASES))
def test_per_file_record_prompt_and_pt_metadata(storage, name):
    case = CASES[name]
    plan = _plan(storage, case)
    expected = _with_dir(case["per_file"], storage)
    assert len(plan.entries) == len(expected)
    for entry, want in zip(plan.entries, expected, strict=True):
        assert (entry.index, entry.path, entry.use_genre) == (
            want["index_in_sorted_list"],
            want["path"],
            want["use_genre"],
        )
        # Key order too: the record is Side-Step's dict, coerced in place.
        assert list(entry.record.items()) == list(want["sample_record"].items())
        assert entry.text_prompt == want["text_prompt"]
        assert list(entry.pt_metadata.items()) == list(want["pt_metadata"].items())


@pytest.mark.parametrize("key", sorted(FIXTURE["select_genre_indices"]))
def test_select_genre_indices(key):
    n, ratio = (int(part.split("=")[1]) for part in key.split(","))
    assert select_genre_indices(n, ratio) == FIXTURE["select_genre_indices"][key]


def test_accepted_shapes():
    sample = {"filename": "a.wav"}
    assert split_dataset_json([sample]) == ({}, [sample])
    assert split_dataset_json({"samples": [sample]}) == ({}, [sample])
    assert split_dataset_json({"metadata": {"x": 1}, "samples": [sample]}) == ({"x": 1}, [sample])
    assert load_dataset_metadata({"metadata": {"genre_ratio": 30}, "samples": []}) == {
        "tag_position": "prepend",
        "genre_ratio": 30,
        "custom_tag": "",
    }
    for bad in ({"metadata": {}}, "text", 3, {"samples": {}}):
        with pytest.raises(InputError, match="list of samples or an object with 'samples'"):
            split_dataset_json(bad)


def test_nothing_resolves_falls_back_to_the_folder(storage):
    storage.write_bytes("sub/b.wav", b"")
    storage.write_bytes("a.flac", b"")
    storage.write_text("dataset.json", '[{"filename": "gone.wav", "caption": "x"}]')
    plan = plan_preprocess(storage, "dataset.json")
    assert plan.files == [storage.url_of("a.flac"), storage.url_of("sub/b.wav")]
    assert plan.entries[0].record == {"duration": 0}


def test_absolute_audio_path_and_json_in_a_subfolder(storage):
    storage.write_bytes("songs/a.wav", b"")
    doc = {"samples": [{"audio_path": storage.url_of("songs/a.wav"), "caption": "abs"}]}
    storage.write_text("meta/dataset.json", json.dumps(doc))
    plan = plan_preprocess(storage, "meta/dataset.json")
    assert plan.files == [storage.url_of("songs/a.wav")]
    assert plan.entries[0].record["caption"] == "abs"
    relative = {"samples": [{"audio_path": "../songs/a.wav", "caption": "rel"}]}
    storage.write_text("meta/dataset.json", json.dumps(relative))
    assert plan_preprocess(storage, "meta/dataset.json").entries[0].record["caption"] == "rel"


def test_duration_that_is_not_a_number_reads_as_zero(storage):
    storage.write_bytes("a.wav", b"")
    storage.write_text("dataset.json", '[{"filename": "a.wav", "duration": "95.5"}, {}]')
    assert plan_preprocess(storage, "dataset.json").entries[0].record["duration"] == 95
    storage.write_text("dataset.json", '[{"filename": "a.wav", "duration": "long"}]')
    assert plan_preprocess(storage, "dataset.json").entries[0].record["duration"] == 0


def test_normalisation_at_the_training_boundary():
    assert [
        normalize_keyscale(k)
        for k in ("C minor", "f# maj", "Bb Minor", "c♯m", "EM", "C", "", "H major", "A dorian")
    ] == ["C minor", "F# major", "Bb minor", "C# minor", "E major", "", "", "", ""]
    assert [normalize_timesignature(s) for s in ("4/4", "3/4", "6/8", "2", "12/8", "5/4", "x")] == [
        "4",
        "3",
        "6",
        "2",
        "",
        "",
        "",
    ]
    assert [normalize_language(x) for x in ("English", "en", "JA", "", "Klingon")] == [
        "en",
        "en",
        "ja",
        "",
        "klingon",
    ]


# -- builder -------------------------------------------------------------------------------------
def _summary(**changes) -> DatasetSummary:
    values = {"id": "u1", "slug": "band", "name": "Band", "source_dir": "/songs"}
    return DatasetSummary(**{**values, **changes})


def _sample(rel_path: str, **fields) -> Sample:
    from hotstep_ray.dataset.ids import sample_id

    name = rel_path.rsplit("/", 1)[-1]
    return Sample(
        sample_id=sample_id(rel_path),
        rel_path=rel_path,
        audio_path=f"/songs/{rel_path}",
        filename=name,
        sidecar_path=f"/songs/{rel_path.rsplit('.', 1)[0]}.txt",
        **fields,
    )


SAMPLES = [
    _sample(
        "Sub/My_Song-01.wav",
        caption="",
        lyrics="",
        is_instrumental=True,
        key="f# maj",
        signature="6/8",
        duration=95.9,
    ),
    _sample(
        "b.flac",
        caption="warm soul",
        genre="soul",
        lyrics="hello",
        bpm=92,
        key="A minor",
        signature="4/4",
        language="English",
        custom_tag="own",
        prompt_override="genre",
        repeat=2,
        duration=30.2,
    ),
]


def test_build_dataset_json():
    doc = build_dataset_json(
        _summary(custom_tag="zq", genre_ratio=40, default_language="english"),
        SAMPLES,
        previous=None,
        now="2026-01-02T03:04:05+00:00",
    )
    assert doc == {
        "metadata": {
            "name": "Band",
            "custom_tag": "zq",
            "tag_position": "prepend",
            "created_at": "2026-01-02T03:04:05+00:00",
            "num_samples": 2,
            "all_instrumental": False,
            "genre_ratio": 40,
            "default_artist": "",
            "default_album": "",
            "default_genre": "",
            "default_language": "en",
        },
        "samples": [
            {
                "id": "f6d71d00",
                "audio_path": "/songs/Sub/My_Song-01.wav",
                "filename": "My_Song-01.wav",
                "caption": "My Song 01",
                "genre": "",
                "lyrics": "[Instrumental]",
                "raw_lyrics": "",
                "formatted_lyrics": "",
                "bpm": None,
                "keyscale": "F# major",
                "timesignature": "6",
                "duration": 95,
                "language": "en",
                "is_instrumental": True,
                "custom_tag": "zq",
                "labeled": False,
                "prompt_override": None,
                "repeat": 1,
            },
            {
                "id": "98fa73cb",
                "audio_path": "/songs/b.flac",
                "filename": "b.flac",
                "caption": "warm soul",
                "genre": "soul",
                "lyrics": "hello",
                "raw_lyrics": "hello",
                "formatted_lyrics": "",
                "bpm": 92,
                "keyscale": "A minor",
                "timesignature": "4",
                "duration": 30,
                "language": "en",
                "is_instrumental": False,
                "custom_tag": "own",
                "labeled": True,
                "prompt_override": "genre",
                "repeat": 2,
            },
        ],
    }
    text = dumps_dataset_json(doc)
    assert text.startswith('{\n  "metadata": {\n    "name": "Band",\n')
    assert not text.endswith("\n")


def test_rebuild_keeps_unknown_keys_and_created_at():
    previous = json.loads(
        dumps_dataset_json(
            {
                "metadata": {"created_at": "2020-05-05T10:00:00", "name": "old", "owner": "me"},
                "samples": [
                    {
                        "audio_path": "/SONGS/B.FLAC",  # matched case-insensitively
                        "caption": "stale",
                        "formatted_lyrics": "[verse]\nhello",
                        "mood": "happy",
                    },
                    {"audio_path": "/songs/gone.wav", "note": "dropped with its file"},
                ],
            }
        )
    )
    doc = build_dataset_json(_summary(), SAMPLES, previous, now="2026-01-02T03:04:05+00:00")
    assert doc["metadata"]["created_at"] == "2020-05-05T10:00:00"
    assert (doc["metadata"]["name"], doc["metadata"]["owner"]) == ("Band", "me")
    assert list(doc["metadata"])[-1] == "owner"
    first, second = doc["samples"]
    assert "mood" not in first and "note" not in first
    assert (second["caption"], second["formatted_lyrics"], second["mood"]) == (
        "warm soul",
        "[verse]\nhello",
        "happy",
    )
    assert list(second)[-1] == "mood"


def test_our_build_reads_back_through_sidestep_rules(storage):
    for sample in SAMPLES:
        storage.write_bytes(sample.rel_path, b"")
    local = [s.model_copy(update={"audio_path": storage.url_of(s.rel_path)}) for s in SAMPLES]
    summary = _summary(custom_tag="zq", tag_position="append", genre_ratio=100)
    doc = build_dataset_json(summary, local, None, now="2026-01-02T03:04:05+00:00")
    storage.write_text("out/dataset.json", dumps_dataset_json(doc))
    plan = plan_preprocess(storage, "out/dataset.json")
    assert plan.files == [storage.url_of("Sub/My_Song-01.wav"), storage.url_of("b.flac")]
    assert [e.text_prompt.split("\n")[4] for e in plan.entries] == [
        "My Song 01, zq",  # genre picked but empty: the caption
        "soul, own",
    ]
    assert "- timesignature: 6\n- keyscale: F# major\n- duration: 95 seconds" in (
        plan.entries[0].text_prompt
    )
