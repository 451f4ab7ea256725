"""The songs grid over HTTP: one row per song (file, length, BPM, key, caption, a lyrics excerpt,
label status), one song in full, and a hand edit written into the song's Side-Step sidecar
through the dataset layer (atomic, the original kept as `.bak`); bad values answer 422 with a
message naming the field, and nothing is written."""

from __future__ import annotations

import pytest

API = "/api/training"
SONG = "01_morning_drive"  # a sidecar with caption, lyrics and metas


def _song(client, dataset, name=SONG):
    songs = client.get(f"{API}/datasets/{dataset['slug']}/songs").json()["songs"]
    return next(s for s in songs if s["file"].startswith(name))


def test_the_grid_lists_every_song_with_its_fields(client, dataset):
    response = client.get(f"{API}/datasets/{dataset['id']}/songs")
    assert response.status_code == 200
    body = response.json()
    assert body["datasetId"] == dataset["id"] and len(body["songs"]) == 12
    row = next(s for s in body["songs"] if s["file"].startswith(SONG))
    assert row["caption"].startswith("Bright synth-pop") and row["duration"] > 0
    assert row["labelStatus"] == "labeled" and row["lyrics"] is None  # the grid: an excerpt only
    assert set(row) >= {"sampleId", "bpm", "key", "lyricsExcerpt", "error", "excluded"}
    assert all("\n" not in s["lyricsExcerpt"] for s in body["songs"])

    one = client.get(f"{API}/datasets/{dataset['slug']}/songs/{row['sampleId']}")
    assert one.status_code == 200 and one.json()["song"]["lyrics"] is not None
    assert client.get(f"{API}/datasets/{dataset['slug']}/songs/nope").status_code == 404
    assert client.get(f"{API}/datasets/nope/songs").status_code == 404


def test_a_caption_edit_writes_the_sidecar_and_keeps_the_original(client, dataset, songs):
    sidecar = songs / f"{SONG}.txt"
    original = sidecar.read_bytes()
    row = _song(client, dataset)
    url = f"{API}/datasets/{dataset['slug']}/songs/{row['sampleId']}"

    response = client.patch(url, json={"caption": "Sunrise synth-pop, hand-fixed", "bpm": 118})
    assert response.status_code == 200, response.text
    song = response.json()["song"]
    assert song["caption"] == "Sunrise synth-pop, hand-fixed" and song["bpm"] == 118
    assert song["sources"]["caption"] == "user"
    text = sidecar.read_text()
    assert "caption: Sunrise synth-pop, hand-fixed\n" in text and "bpm: 118\n" in text
    assert (songs / f"{SONG}.txt.bak").read_bytes() == original
    assert _song(client, dataset)["caption"] == "Sunrise synth-pop, hand-fixed"  # a rescan agrees

    # A second edit keeps the first backup (the user's original) and normalises key/language.
    again = client.patch(url, json={"key": "f# min", "language": "English", "signature": "6/8"})
    assert again.status_code == 200, again.text
    assert (again.json()["song"]["key"], again.json()["song"]["language"]) == ("F# minor", "en")
    assert "signature: 6/8\n" in sidecar.read_text()
    assert (songs / f"{SONG}.txt.bak").read_bytes() == original


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"bpm": 2000}, "bpm", "outside"),
        ({"bpm": "fast"}, "bpm", "whole number"),
        ({"bpm": 120.5}, "bpm", "whole number"),
        ({"bpm": True}, "bpm", "whole number"),
        ({"key": "H dorian"}, "key", "major or minor"),
        ({"signature": "5/4"}, "signature", "beats per bar"),
        ({"language": "Klingon!"}, "language", "language code"),
        ({"caption": "fine\nbpm: 5"}, "", "read back as a field"),
        ({"colour": "red"}, "colour", ""),
        ({}, "", "name a field"),
    ],
    ids=[
        "bpm-range",
        "bpm-word",
        "bpm-fraction",
        "bpm-bool",
        "key",
        "signature",
        "language",
        "caption-key-line",
        "unknown-field",
        "empty",
    ],
)
def test_bad_values_answer_422_and_write_nothing(client, dataset, songs, body, field, words):
    sidecar = songs / f"{SONG}.txt"
    before = sidecar.read_bytes()
    url = f"{API}/datasets/{dataset['slug']}/songs/{_song(client, dataset)['sampleId']}"
    response = client.patch(url, json=body)
    assert response.status_code == 422, response.text
    message = response.json()["error"]
    assert message.startswith(f"{field}:") if field else True
    assert words in message, message
    assert sidecar.read_bytes() == before and not (songs / f"{SONG}.txt.bak").exists()


def test_clearing_bpm_and_editing_a_song_without_a_sidecar(client, dataset, songs):
    row = _song(client, dataset, "12_")  # bpm in its sidecar
    url = f"{API}/datasets/{dataset['slug']}/songs/{row['sampleId']}"
    cleared = client.patch(url, json={"bpm": None})
    assert cleared.status_code == 200 and cleared.json()["song"]["bpm"] is None

    bare = next(
        s
        for s in client.get(f"{API}/datasets/{dataset['slug']}/songs").json()["songs"]
        if not s["sidecarExists"]
    )
    url = f"{API}/datasets/{dataset['slug']}/songs/{bare['sampleId']}"
    written = client.patch(url, json={"caption": "Written from the studio"})
    assert written.status_code == 200, written.text
    stem = bare["file"].rsplit(".", 1)[0]
    assert "caption: Written from the studio\n" in (songs / f"{stem}.txt").read_text()
    assert not (songs / f"{stem}.txt.bak").exists()  # nothing was there to back up
