"""Where Ray Train keeps its state for a storage root (`distributed.ray_results`)."""

from __future__ import annotations

import os

from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.ray_results import checkpoint_folder, results_location


def test_a_local_root_gets_a_created_folder_and_no_filesystem(tmp_path) -> None:
    location = results_location(Storage(tmp_path / "data"))
    path, filesystem = location["storage_path"], location["storage_filesystem"]
    assert path == str(tmp_path / "data" / "ray_results") and os.path.isdir(path)
    assert filesystem is None


def test_a_remote_root_hands_ray_its_own_filesystem() -> None:
    storage = Storage(
        "s3://bucket/prefix",
        key="k",
        secret="s",
        client_kwargs={"endpoint_url": "http://127.0.0.1:9"},
    )
    location = results_location(storage, "ray_results/")
    path, filesystem = location["storage_path"], location["storage_filesystem"]
    assert path == "bucket/prefix/ray_results"  # inside the filesystem: no scheme
    assert filesystem.type_name.startswith("py::fsspec")  # pyarrow over the root's own s3fs
    assert filesystem.handler.fs is storage.fs  # same keys and endpoint as every stage


def test_each_worker_reads_a_remote_checkpoint_from_a_folder_of_its_own() -> None:
    """Two workers restoring one remote checkpoint: the one that finishes first must not delete
    the folder the other still reads (Ray's shared `as_directory` folder does)."""
    import fsspec
    from pyarrow import fs
    from ray.train import Checkpoint

    memory = fsspec.filesystem("memory")
    memory.pipe("/ckpt/state.json", b'{"step": 4}')
    checkpoint = Checkpoint("/ckpt", filesystem=fs.PyFileSystem(fs.FSSpecHandler(memory)))
    with checkpoint_folder(checkpoint) as first:
        with checkpoint_folder(checkpoint) as second:
            assert first != second
        assert open(os.path.join(first, "state.json")).read() == '{"step": 4}'
    assert not os.path.exists(first) and not os.path.exists(second)  # nothing left in /tmp


def test_a_local_checkpoint_is_read_where_it_lies(tmp_path) -> None:
    from ray.train import Checkpoint

    (tmp_path / "state.json").write_text("{}")
    with checkpoint_folder(Checkpoint.from_directory(str(tmp_path))) as folder:
        assert folder == str(tmp_path)
    assert (tmp_path / "state.json").exists()  # the run's own checkpoint is never removed
