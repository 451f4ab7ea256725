"""Where Ray Train keeps its state for a storage root (`distributed.ray_results`)."""

from __future__ import annotations

import os

from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.ray_results import results_location


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
