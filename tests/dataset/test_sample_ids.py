"""Sample ids: sha1 of the lower-cased relative path with forward slashes."""

from __future__ import annotations

from hotstep_ray.dataset.ids import canonical_rel_path, dataset_json_id, sample_id


def test_sample_id_is_16_hex_of_sha1_of_lowercased_path():
    # sha1("sub/song.wav") = 979babab713edfca27b466dd8f5a912507b79242
    assert sample_id("sub/song.wav") == "979babab713edfca"
    assert sample_id("Sub/Song.WAV") == "979babab713edfca"
    assert sample_id("Sub\\Song.wav") == "979babab713edfca"


def test_dataset_json_id_is_the_first_8_hex_of_the_same_sha1():
    # sha1("song.flac") = b6489331604fcc1aa56d0560d7bf4125330c4910
    assert dataset_json_id("Song.FLAC") == "b6489331"
    assert sample_id("song.flac").startswith(dataset_json_id("song.flac"))


def test_canonical_rel_path():
    assert canonical_rel_path("A\\B/C.Mp3") == "a/b/c.mp3"
