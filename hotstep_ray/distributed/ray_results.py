"""Where Ray Train keeps a run's own state (the checkpoints it persists, its results) for one of
our storage roots.

Ray Train writes through a pyarrow filesystem. Given only an `s3://` URL, it builds one from the
environment alone and creates every folder level as an empty "dir/" object. Two things break:
- a root opened with explicit options (keys, the endpoint of an S3-compatible store) is
  ignored;
- some S3-compatible stores cannot hold such a marker beside real keys (rclone's `serve s3`
  stores "a/" as an empty file "a", and everything under "a/" then fails).
So a remote root hands Ray its own fsspec filesystem, wrapped for pyarrow. Ray then writes with
the same credentials, endpoint and folder semantics as every other stage (s3fs creates no
markers). The path is given inside that filesystem (`bucket/prefix/...`), as Ray expects with
`storage_filesystem`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from hotstep_ray.core.layout import RAY_RESULTS as RESULTS_DIR
from hotstep_ray.core.storage import Storage


def results_location(storage: Storage, subdir: str = RESULTS_DIR) -> dict[str, Any]:
    """`storage_path` and `storage_filesystem` for `ray.train.RunConfig(**...)`: a local folder
    (created) and None, or a remote root's path inside its own filesystem and that filesystem
    for pyarrow."""
    if storage.is_local:
        path = storage.url_of(subdir)
        os.makedirs(path, exist_ok=True)
        return {"storage_path": path, "storage_filesystem": None}
    from pyarrow import fs

    return {
        "storage_path": f"{storage.root_path}/{subdir.strip('/')}",
        "storage_filesystem": fs.PyFileSystem(fs.FSSpecHandler(storage.fs)),
    }


@contextlib.contextmanager
def checkpoint_folder(checkpoint: Any) -> Iterator[str]:
    """A local folder holding a Ray Train checkpoint's files, for one worker.

    `Checkpoint.as_directory()` shares one temporary folder between the workers of a node: one
    downloads under a file lock, the others wait and then check the folder exists. The first
    worker to finish deletes it, so a slower worker can find it gone and fail the restart
    ("Checkpoint directory ... does not exist"). Each worker here downloads into a folder of its
    own, removed afterwards; a checkpoint already on the local disk is read where it lies."""
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield checkpoint.path
        return
    folder = tempfile.mkdtemp(prefix="hotstep-ckpt-")
    try:
        yield checkpoint.to_directory(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
