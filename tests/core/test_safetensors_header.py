"""Safetensors headers read without the tensors (`core.safetensors_header`)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from hotstep_ray.core import safetensors_header
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage


def test_the_header_comes_from_two_ranged_reads_of_its_own_bytes(tmp_path, monkeypatch):
    storage = Storage(tmp_path)
    data = save({"x": torch.zeros(1000, 100)}, metadata={"json": '{"frames": 200}'})
    storage.write_bytes("song.safetensors", data)
    reads: list[tuple[int, int]] = []
    real = Storage.read_range

    def recording(self, key, start, end):
        reads.append((start, end))
        return real(self, key, start, end)

    monkeypatch.setattr(Storage, "read_range", recording)
    monkeypatch.setattr(Storage, "read_bytes", lambda *a: pytest.fail("read the whole file"))
    assert safetensors_header.read_metadata(storage, "song.safetensors") == {
        "json": '{"frames": 200}'
    }
    header_end = reads[-1][1]
    assert reads[0] == (0, 8) and header_end <= len(data) - 4 * 1000 * 100  # no tensor byte read
    header, payload = safetensors_header.split(data)
    assert header["x"]["shape"] == [1000, 100] and len(payload) == 4 * 1000 * 100


@pytest.mark.parametrize(
    "blob, problem",
    [
        (b"abc", "shorter than 8"),
        (b"\xff" * 16, "out of range"),
        (b"\x20" + b"\0" * 7, "truncated"),
    ],
)
def test_what_is_not_safetensors_is_refused_in_one_line(tmp_path, blob, problem):
    storage = Storage(tmp_path)
    storage.write_bytes("bad.safetensors", blob)
    with pytest.raises(InputError, match=problem):
        safetensors_header.read_header(storage, "bad.safetensors")
    with pytest.raises(InputError, match=problem):
        safetensors_header.split(blob)


def test_a_server_that_rejects_ranged_reads_gets_the_whole_object(tmp_path, monkeypatch):
    """rclone's `serve s3` sends the whole object's checksum with a ranged GET, which botocore
    rejects: the read falls back to the whole object, and the bytes are the same."""

    class FlexibleChecksumError(Exception):  # botocore's name, which the fallback matches
        pass

    storage = Storage(tmp_path)
    storage.write_bytes("f.bin", bytes(range(100)))
    real = storage.fs.cat_file

    def picky(path, start=None, end=None, **kwargs):
        if start is not None or end is not None:
            raise FlexibleChecksumError("Expected checksum ... did not match")
        return real(path, **kwargs)

    monkeypatch.setattr(storage.fs, "cat_file", picky)
    assert storage.read_range("f.bin", 8, 16) == bytes(range(8, 16))
