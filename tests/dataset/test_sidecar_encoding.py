"""Sidecars that are not UTF-8, backups that keep the user's original, and write errors that
name the sidecar (hotstep_ray/dataset/sidecar.py, "Text that is not UTF-8" and `write_sidecar`)."""

from __future__ import annotations

import errno
import tempfile

import pytest

from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import (
    decode_sidecar,
    decode_sidecar_as,
    load_sidecar,
    parse_sidecar_bytes,
    write_sidecar,
)

CAFE = "caption: Café song\ngenre: chanson\nlyrics:\nCafé au lait, “déjà vu”\n"
FFFD = "\ufffd"


def _no_replacement_anywhere(storage: Storage, folder: str = "") -> None:
    """No file holds a U+FFFD, as bytes or as the text the loader reads from it."""
    for key in storage.list(folder):
        data = storage.read_bytes(key)
        assert FFFD.encode() not in data and FFFD not in decode_sidecar(data), key


def test_a_cp1252_sidecar_reads_losslessly(storage):
    original = CAFE.encode("cp1252")
    storage.write_bytes("a.txt", original)
    loaded = load_sidecar(storage, "a")
    assert loaded.fields == {
        "caption": "Café song",
        "genre": "chanson",
        "lyrics": "Café au lait, “déjà vu”",
    }
    assert (loaded.convention, loaded.legacy_files) == ("txt", ("a.txt",))
    assert decode_sidecar_as(original) == (CAFE, "cp1252")
    # UTF-8 (with or without a BOM) is read as UTF-8, never as cp1252.
    assert decode_sidecar_as(CAFE.encode()) == (CAFE, "utf-8")
    assert decode_sidecar_as(b"\xef\xbb\xbf" + CAFE.encode()) == (CAFE, "utf-8")
    storage.write_bytes("b.txt", CAFE.encode())
    assert load_sidecar(storage, "b").legacy_files == ()


def test_two_writes_keep_the_original_bytes_in_bak(storage):
    """The issue's sequence: a cp1252 sidecar, written twice. Before, the first write stored
    U+FFFD in place of every `é` and the second replaced `.bak`, so the original was gone."""
    original = CAFE.encode("cp1252")
    storage.write_bytes("a.txt", original)
    first = {**load_sidecar(storage, "a").fields, "bpm": 96}
    assert write_sidecar(storage, "a.txt", first) is True
    once = storage.read_bytes("a.txt")
    assert parse_sidecar_bytes(once)["lyrics"] == "Café au lait, “déjà vu”"  # UTF-8 now
    assert once.decode("utf-8")
    second = {**load_sidecar(storage, "a").fields, "caption": "Une chanson de café"}
    assert write_sidecar(storage, "a.txt", second) is True
    third = {**load_sidecar(storage, "a").fields, "key": "C major"}
    assert write_sidecar(storage, "a.txt", third) is True
    assert storage.read_bytes("a.txt.bak") == original  # the first backup is never replaced
    assert parse_sidecar_bytes(storage.read_bytes("a.txt.bak.1"))["caption"] == (
        "Une chanson de café"
    )  # the latest write's previous file
    assert storage.list("") == ["a.txt", "a.txt.bak", "a.txt.bak.1"]
    assert load_sidecar(storage, "a").fields["caption"] == "Une chanson de café"
    _no_replacement_anywhere(storage)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # 0x81 is one of the five bytes cp1252 leaves undefined
        (
            b"caption: caf\xe9 \x81\n",
            "byte 0xe9 at offset 12 is not UTF-8 and byte 0x81 at offset 14 is not cp1252; "
            "re-save it as UTF-8",
        ),
        # valid UTF-8 (an em dash) beside an invalid byte: read as cp1252, the dash would be
        # mojibake, so neither encoding reads the file as it was meant
        (
            b"caption: caf\xe9 \xe2\x80\x94 x\n",  # the em dash is UTF-8
            "byte 0xe9 at offset 12 is not UTF-8, yet the file also holds UTF-8 text",
        ),
        # a UTF-8 BOM claims UTF-8: the offset counts the BOM
        (b"\xef\xbb\xbfcaption: caf\xe9\n", "byte 0xe9 at offset 15 is not UTF-8, yet"),
    ],
)
def test_bytes_no_encoding_reads_losslessly_are_refused(storage, data, message):
    storage.write_bytes("s.txt", data)
    with pytest.raises(InputError) as refused:
        load_sidecar(storage, "s")
    text = str(refused.value)
    assert text.startswith(f"cannot read sidecar {storage.url_of('s.txt')}: {message}")
    assert "\n" not in text


def test_a_split_sidecar_in_cp1252_is_named_too(storage):
    storage.write_bytes("s.caption.txt", "Café".encode("cp1252"))
    storage.write_bytes("s.lyrics.txt", b"la la")
    loaded = load_sidecar(storage, "s")
    assert loaded.fields == {"caption": "Café", "lyrics": "la la"}
    assert loaded.legacy_files == ("s.caption.txt",)


def test_a_new_replacement_character_is_never_written(storage):
    with pytest.raises(InputError, match="U\\+FFFD"):
        write_sidecar(storage, "a.txt", {"caption": f"Caf{FFFD} song"})
    assert storage.list("") == []
    # A U+FFFD the user's own UTF-8 file already holds is theirs: other edits still save.
    storage.write_bytes("b.txt", f"caption: odd {FFFD} glyph\n".encode())
    fields = {**load_sidecar(storage, "b").fields, "genre": "rock"}
    assert write_sidecar(storage, "b.txt", fields) is True


def test_a_read_only_folder_names_the_sidecar_not_the_temp_file(tmp_path, monkeypatch):
    """The atomic write fails creating its temp file; the error must be about the sidecar.
    (Simulated: the suite may run as root, which a chmod'ed folder does not stop.)"""
    storage = Storage(tmp_path)
    storage.write_bytes("a.txt", b"caption: old\n")

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/.tmp-x1y2.part")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(StorageError) as refused:
        write_sidecar(storage, "a.txt", {"caption": "new"})
    assert str(refused.value) == (
        f"cannot write sidecar {tmp_path / 'a.txt'}: the folder {tmp_path} is read-only or not "
        "writable (Permission denied)"
    )
    assert isinstance(refused.value, OSError)  # callers that catch OSError still do

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/x/.tmp-q.part")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(
        StorageError, match="^cannot write sidecar .*a.txt: No space left on device$"
    ):
        write_sidecar(storage, "a.txt", {"caption": "new"})
    assert (tmp_path / "a.txt").read_bytes() == b"caption: old\n"
