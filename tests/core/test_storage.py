"""Storage: keys stay inside the root, writes are atomic, the same API works on local, memory and S3."""

from __future__ import annotations

import os

import pytest

from hotstep_ray.core.errors import StorageError
from hotstep_ray.core.storage import Storage, normalize_key


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "..", "C:/x"])
def test_keys_cannot_escape_the_root(tmp_path, bad):
    storage = Storage(tmp_path)
    with pytest.raises(StorageError):
        storage.write_bytes(bad, b"x")
    assert not (tmp_path.parent / "x").exists()


def test_normalize_key_cleans_harmless_forms():
    assert normalize_key("a//b/./c") == "a/b/c"
    assert normalize_key("a\\b") == "a/b"
    assert normalize_key("a/b/../c") == "a/c"
    assert normalize_key("") == ""


def test_local_write_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    storage = Storage(tmp_path)
    storage.write_text("d/f.txt", "old")

    # A crash between writing the temp file and renaming it must leave the old content intact.
    def boom(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        storage.write_text("d/f.txt", "new")
    monkeypatch.undo()
    assert storage.read_text("d/f.txt") == "old"
    assert sorted(os.listdir(tmp_path / "d")) == ["f.txt"]


def test_roundtrip_list_walk_and_json(tmp_path):
    storage = Storage(tmp_path)
    storage.write_json("a/x.json", {"k": "é"})
    storage.write_bytes("a/b/y.bin", b"\x00\x01")
    assert storage.read_json("a/x.json") == {"k": "é"}
    # indent=2, ensure_ascii=False, trailing newline: files a human can diff
    assert storage.read_bytes("a/x.json") == '{\n  "k": "é"\n}\n'.encode()
    assert storage.list("a") == ["a/b", "a/x.json"]
    assert list(storage.walk_files("a")) == ["a/b/y.bin", "a/x.json"]
    assert storage.list("missing") == []
    assert storage.key_of(storage.full_path("a/b/y.bin")) == "a/b/y.bin"
    with pytest.raises(StorageError, match="not found"):
        storage.read_bytes("nope")


def test_child_storage_shares_the_filesystem(tmp_path):
    storage = Storage(tmp_path)
    child = storage.child("datasets/one")
    child.write_text("meta.json", "{}")
    assert storage.read_text("datasets/one/meta.json") == "{}"
    with pytest.raises(StorageError):
        child.write_text("../escape.txt", "x")


def test_memory_backend_behaves_like_local():
    storage = Storage("memory://hotstep-test-root")
    storage.write_text("a/b.txt", "hi")
    storage.append_line("a/log.jsonl", '{"n":1}')
    storage.append_line("a/log.jsonl", '{"n":2}')
    assert not storage.is_local
    assert storage.read_text("a/b.txt") == "hi"
    assert storage.read_text("a/log.jsonl") == '{"n":1}\n{"n":2}\n'
    assert storage.url_of("a/b.txt").startswith("memory://")
    with pytest.raises(StorageError):
        storage.local_path("a/b.txt")
    storage.delete("a", recursive=True)
    assert not storage.exists("a/b.txt")


@pytest.fixture(scope="module")
def s3_endpoint():
    moto_server = pytest.importorskip("moto.server")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"  # moto refuses a bucket constraint elsewhere
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_s3_backend_reads_and_writes(s3_endpoint):
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}, "anon": False}
    bucket = Storage("s3://hotstep-bucket", **options)
    bucket.fs.mkdir("hotstep-bucket")
    storage = Storage("s3://hotstep-bucket/prefix", **options)
    storage.write_json("datasets/x/dataset_meta.json", {"n": 3})
    storage.write_bytes("tensors/x/a.safetensors", b"\x01" * 1000)
    assert storage.read_json("datasets/x/dataset_meta.json") == {"n": 3}
    assert storage.size("tensors/x/a.safetensors") == 1000
    assert list(storage.walk_files("datasets")) == ["datasets/x/dataset_meta.json"]
    assert storage.url_of("datasets") == "s3://hotstep-bucket/prefix/datasets"


def test_local_writes_follow_the_umask_not_mkstemps_0600(tmp_path, monkeypatch):
    """A cache or adapter written by one account must be readable by another (shared storage, a
    cluster node's other user): the mode is what `open()` gives, 0666 less the umask."""
    import stat
    from pathlib import Path

    from hotstep_ray.core import storage as storage_module

    for umask, mode in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600)):
        monkeypatch.setattr(storage_module, "_UMASK", umask)
        path = Path(Storage(tmp_path).write_bytes(f"a/{umask:o}.bin", b"x"))
        assert stat.S_IMODE(path.stat().st_mode) == mode
