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

import os
from typing import Any

from hotstep_ray.core.storage import Storage

RESULTS_DIR = "ray_results"


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
