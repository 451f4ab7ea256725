"""Sidecars against Side-Step's recorded behaviour (tests/fixtures/sidestep/sidecars.json)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import (
    LoadedSidecar,
    load_sidecar,
    load_sidecar_metadata,
    normalize_sidecar,
    parse_sidecar_bytes,
    parse_sidecar_text,
    render_sidecar,
    write_sidecar,
)

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sidestep" / "sidecars.json").read_text("utf-8")
)
PARSE = {case["name"]: case for case in FIXTURE["parse_cases"]}
WRITE = {case["name"]: case for case in FIXTURE["write_cases"]}
AUDIO = "My_Song-01.wav"
# Write cases where we differ from Side-Step on purpose (see hotstep_ray/dataset/sidecar.py).
DELIBERATE = {"none_values", "extra_keys_sorted"}
# Parse cases we refuse to read on purpose: not UTF-8, and not cp1252 either, since the file also
# holds UTF-8 text (Side-Step reads U+FFFD there, which a later write would store for good).
DELIBERATE_READS = {"invalid_utf8_lone_cr_formfeed"}


def _input_bytes(case: dict) -> bytes:
    return base64.b64decode(case["input_b64"])


def _put_case(storage: Storage, case: dict) -> None:
    storage.write_bytes("My_Song-01.txt", _input_bytes(case))
    for name, text in case["sibling_files"].items():
        storage.write_bytes(name, text.encode("utf-8"))


def test_fixture_counts():
    assert len(PARSE) == 27
    assert len(WRITE) == 10
    assert DELIBERATE <= set(WRITE)
    assert DELIBERATE_READS <= set(PARSE)


@pytest.mark.parametrize("name", sorted(PARSE))
def test_parse_txt_metadata(name):
    case = PARSE[name]
    data = _input_bytes(case)
    if name in DELIBERATE_READS:
        with pytest.raises(InputError, match="byte 0xe9 at offset 12 is not UTF-8"):
            parse_sidecar_bytes(data)
        # The line rules still match Side-Step's on the text it decoded (lone CR, form feed,
        # U+2028): only the decoding differs.
        text = data.decode("utf-8-sig", errors="replace")
        assert parse_sidecar_text(text) == case["parse_txt_metadata"]
        return
    assert parse_sidecar_bytes(data) == case["parse_txt_metadata"]


@pytest.mark.parametrize("name", sorted(PARSE))
def test_load_sidecar_metadata(storage, name):
    case = PARSE[name]
    _put_case(storage, case)
    if name in DELIBERATE_READS:
        url = storage.url_of("My_Song-01.txt")
        with pytest.raises(InputError) as refused:
            load_sidecar_metadata(storage, AUDIO)
        assert str(refused.value).startswith(f"cannot read sidecar {url}: byte 0xe9 at offset 12")
        return
    assert load_sidecar_metadata(storage, AUDIO) == case["load_sidecar_metadata"]


@pytest.mark.parametrize("name", sorted(PARSE))
def test_normalize_sidecar(name):
    case = PARSE[name]
    loaded = case["load_sidecar_metadata"]
    if case["normalize_sidecar"] is None:
        # Side-Step then uses default_sample_meta, which is what normalising {} gives.
        assert loaded == {}
        expected = FIXTURE["meta"]["default_sample_meta_for_My_Song-01.wav"]
    else:
        expected = case["normalize_sidecar"]
    assert normalize_sidecar(loaded, AUDIO) == expected


def test_loader_conventions(storage):
    _put_case(storage, PARSE["basic_full"])
    assert load_sidecar(storage, "My_Song-01").convention == "txt"
    _put_case(storage, PARSE["no_caption_with_caption_txt"])
    split = load_sidecar(storage, "My_Song-01")
    assert (split.convention, split.files) == (
        "split",
        ("My_Song-01.txt", "My_Song-01.caption.txt", "My_Song-01.lyrics.txt"),
    )
    assert load_sidecar(storage, "Nothing").convention == "none"
    storage.write_bytes("Only.txt", b"la la\n")
    assert load_sidecar(storage, "Only") == LoadedSidecar(
        {"lyrics": "la la"}, "lyrics_only", ("Only.txt",)
    )


def test_an_empty_caption_value_reads_as_side_step_reads_it(storage):
    # Side-Step tests the caption's value, not the key: `caption:` with nothing after it falls
    # back to the split files, then to the whole text as lyrics (every other field dropped).
    text = "caption: \ngenre: rock\nbpm: 96\nlyrics:\nla\n"
    storage.write_text("s.txt", text)
    loaded = load_sidecar(storage, "s")
    assert (loaded.convention, loaded.fields) == ("lyrics_only", {"lyrics": text.strip()})
    storage.write_text("s.caption.txt", "Warm piano")
    split = load_sidecar(storage, "s")
    assert (split.convention, split.fields) == ("split", {"caption": "Warm piano"})
    # "caption:  " (spaces only) is as empty as "caption:" once the value is stripped
    storage.write_text("t.txt", "caption:   \ngenre: rock\n")
    assert load_sidecar(storage, "t").convention == "lyrics_only"


def test_our_writes_never_lose_fields_to_the_empty_caption_rule(storage):
    """An unlabeled song's other fields survive the write and the read back: the caption is the
    file-name caption Side-Step would use anyway. With nothing else to keep, the bytes stay
    Side-Step's own (`caption: ` for an empty dict)."""
    assert write_sidecar(storage, "My_song-1.txt", {"genre": "rock", "lyrics": "la"}) is True
    loaded = load_sidecar(storage, "My_song-1")
    assert loaded.convention == "txt"
    assert (loaded.fields["caption"], loaded.fields["genre"]) == ("My song 1", "rock")
    assert normalize_sidecar(loaded.fields, "My_song-1.wav")["is_instrumental"] is False
    write_sidecar(storage, "empty.txt", {})
    assert storage.read_bytes("empty.txt").startswith(b"caption: \n")


def test_unreadable_sidecar_raises(tmp_path):
    (tmp_path / "song.txt").mkdir()  # a folder where the sidecar should be
    with pytest.raises(InputError, match="cannot read sidecar .*song.txt"):
        load_sidecar(Storage(tmp_path), "song")


@pytest.mark.parametrize("name", sorted(set(WRITE) - DELIBERATE))
def test_write_sidecar_bytes(storage, name):
    case = WRITE[name]
    fields = json.loads(case["input_dict_json"])
    expected = base64.b64decode(case["bytes_b64"])
    assert render_sidecar(fields) == expected
    assert write_sidecar(storage, "x.txt", fields) is True
    assert storage.read_bytes("x.txt") == expected
    assert parse_sidecar_bytes(expected) == case["parse_txt_metadata_of_written"]


def test_write_matches_sidestep_on_all_but_the_deliberate_cases():
    matching = {
        name
        for name, case in WRITE.items()
        if name not in DELIBERATE
        and render_sidecar(json.loads(case["input_dict_json"]))
        == base64.b64decode(case["bytes_b64"])
    }
    assert len(matching) == 8


def test_deliberate_none_is_written_empty():
    case = WRITE["none_values"]
    sidestep = base64.b64decode(case["bytes_b64"])
    assert sidestep.startswith(b"caption: None\ngenre: None\n")  # what Side-Step writes
    ours = render_sidecar(json.loads(case["input_dict_json"]))
    assert ours == (b"caption: \ngenre: \nbpm: \nkey: \nsignature: \nis_instrumental: \nlyrics:\n")
    assert parse_sidecar_bytes(ours)["caption"] == ""  # not the caption "None"


def test_deliberate_unknown_keys_are_refused():
    case = WRITE["extra_keys_sorted"]
    fields = json.loads(case["input_dict_json"])
    # Side-Step writes them, and its own parser folds them into the previous field:
    assert case["parse_txt_metadata_of_written"]["is_instrumental"] == "alpha: a"
    assert case["parse_txt_metadata_of_written"]["repeat"] == "2\nzeta: z"
    with pytest.raises(InputError, match=r"\['alpha', 'zeta'\]"):
        render_sidecar(fields)
    # Without them (the empty `empty_extra` is fine), the bytes are Side-Step's minus those lines.
    known = {k: v for k, v in fields.items() if k not in ("alpha", "zeta")}
    sidestep = base64.b64decode(case["bytes_b64"])
    ours = render_sidecar(known)
    assert ours == sidestep.replace(b"alpha: a\n", b"").replace(b"zeta: z\n", b"")
    reread = parse_sidecar_bytes(ours)
    assert (reread["is_instrumental"], reread["repeat"], reread["custom_tag"]) == ("", "2", "zxq")


def test_deliberate_value_that_would_read_back_as_a_key_is_refused():
    with pytest.raises(InputError, match="'caption'.*'bpm: 5'"):
        render_sidecar({"caption": "line1\n  bpm: 5"})
    # Lyrics are terminal, so key-like lines are safe there; `[x: y]` lines are never keys.
    fields = {"caption": "a\n[Chorus: loud]", "lyrics": "bpm: 5\ncaption: no"}
    assert parse_sidecar_bytes(render_sidecar(fields)) == {
        "caption": "a\n[Chorus: loud]",
        "genre": "",
        "bpm": "",
        "key": "",
        "signature": "",
        "is_instrumental": "",
        "lyrics": "bpm: 5\ncaption: no",
    }


def test_deliberate_aliases_written_canonically_and_audio_codes_dropped():
    out = render_sidecar(
        {"caption": "c", "keyscale": "D major", "tempo": 99, "lang": "fr", "audio_codes": "1,2"}
    )
    assert out == (
        b"caption: c\ngenre: \nbpm: 99\nkey: D major\nsignature: \nis_instrumental: \n"
        b"language: fr\nlyrics:\n"
    )
    assert render_sidecar({"key": "E minor", "scale": "A minor"}).count(b"key: E minor\n") == 1


def test_round_trip_keeps_every_parsed_field():
    # Everything the parser can produce (trigger and tags included) survives a rewrite; only
    # boolean words are lower-cased, as Side-Step's writer does ("TRUE" -> "true").
    def words(value: str) -> str:
        return value.lower() if value.lower() in ("true", "false") else value

    for case in PARSE.values():
        parsed = case["parse_txt_metadata"]
        reread = parse_sidecar_bytes(render_sidecar(parsed))
        assert {k: v for k, v in reread.items() if v} == {
            k: words(v) for k, v in parsed.items() if v
        }


def test_write_keeps_bak_and_is_atomic(storage):
    assert write_sidecar(storage, "sub/a.txt", {"caption": "first"}) is True
    assert not storage.exists("sub/a.txt.bak")
    first = storage.read_bytes("sub/a.txt")
    assert write_sidecar(storage, "sub/a.txt", {"caption": "second"}) is True
    assert storage.read_bytes("sub/a.txt.bak") == first
    assert parse_sidecar_bytes(storage.read_bytes("sub/a.txt"))["caption"] == "second"
    assert storage.list("sub") == ["sub/a.txt", "sub/a.txt.bak"]  # no temp file left
    # Unchanged bytes: nothing is written.
    assert write_sidecar(storage, "sub/a.txt", {"caption": "second"}) is False
    assert storage.list("sub") == ["sub/a.txt", "sub/a.txt.bak"]
    assert storage.read_bytes("sub/a.txt.bak") == first
