"""One storage layer over fsspec, rooted at a URL.

Every stage reads and writes through a `Storage`: a local folder by default, `s3://bucket/prefix` on a
cluster. Keys are POSIX-style paths relative to the root (`datasets/my-band/dataset.json`); a key that
would escape the root (`..`, absolute) is refused, so a bad dataset name can never write elsewhere.

Writes are atomic: locally a temp file in the same directory then `os.replace` (a crash leaves the old
file or the new one, never half of each); on object stores a single `put`, which S3 makes visible all
at once.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from hotstep_ray.core.errors import StorageError

# One process's appends to an object-store log, one at a time (see `append_line`).
_REMOTE_APPEND = threading.Lock()
# The process's umask, read once (reading it means setting it: not something to do per write).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def normalize_key(key: str) -> str:
    """Clean a relative key; raise when it is absolute or climbs out of the root."""
    key = key.replace("\\", "/")
    if key.startswith("/") or (len(key) > 1 and key[1] == ":"):
        raise StorageError(f"storage key must be relative to the root, got {key!r}")
    cleaned = posixpath.normpath(key) if key else "."
    if cleaned == ".." or cleaned.startswith("../"):
        raise StorageError(f"storage key escapes the root: {key!r}")
    return "" if cleaned == "." else cleaned


class Storage:
    """A root URL plus the fsspec filesystem that serves it.

    Args:
        root: a local path (`./data`, `/mnt/x`) or a URL (`s3://bucket/prefix`, `memory://x`).
        storage_options: passed to fsspec (e.g. `client_kwargs={"endpoint_url": ...}` for S3).
    """

    def __init__(self, root: str | os.PathLike[str], **storage_options: Any) -> None:
        root_str = os.fspath(root)
        self.fs, path = fsspec.core.url_to_fs(root_str, **storage_options)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        if self.is_local:
            path = str(Path(path).expanduser().resolve())
        self.root_path = path.rstrip("/") or "/"
        self.url = self.root_path if self.is_local else f"{self._protocol()}://{self.root_path}"
        self.storage_options = storage_options

    def _protocol(self) -> str:
        protocol = self.fs.protocol
        return protocol[0] if isinstance(protocol, tuple | list) else protocol

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    # -- paths ---------------------------------------------------------------------------------
    def full_path(self, key: str) -> str:
        """The filesystem path (without protocol) of a key."""
        key = normalize_key(key)
        return f"{self.root_path}/{key}" if key else self.root_path

    def url_of(self, key: str) -> str:
        """A URL other tools (Ray Data, pyarrow) can open: a plain path locally."""
        path = self.full_path(key)
        return path if self.is_local else f"{self._protocol()}://{path}"

    def local_path(self, key: str) -> Path:
        """The local `Path` of a key; only for local roots (code that needs a real file)."""
        if not self.is_local:
            raise StorageError(f"{self.url} is not local; read the bytes instead of a path")
        return Path(self.full_path(key))

    def key_of(self, full_path: str) -> str:
        """Inverse of `full_path`: the key of a path under this root."""
        full_path = full_path.replace("\\", "/")
        if "://" in full_path:
            full_path = full_path.split("://", 1)[1]
        prefix = self.root_path.rstrip("/") + "/"
        if full_path.rstrip("/") == self.root_path.rstrip("/"):
            return ""
        if not full_path.startswith(prefix):
            raise StorageError(f"{full_path!r} is not under {self.url!r}")
        return full_path[len(prefix) :]

    def child(self, key: str) -> Storage:
        """A Storage rooted at a sub-key (same filesystem and options)."""
        sub = Storage.__new__(Storage)
        sub.fs, sub.is_local, sub.storage_options = self.fs, self.is_local, self.storage_options
        sub.root_path = self.full_path(key)
        sub.url = sub.root_path if self.is_local else f"{self._protocol()}://{sub.root_path}"
        return sub

    # -- queries -------------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.fs.exists(self.full_path(key))

    def is_dir(self, key: str) -> bool:
        return self.fs.isdir(self.full_path(key))

    def size(self, key: str) -> int:
        return int(self.fs.size(self.full_path(key)))

    def info(self, key: str) -> dict[str, Any]:
        """fsspec info: `size`, `type`, and `mtime` (local) or `LastModified` (S3)."""
        return self.fs.info(self.full_path(key))

    def mtime_ns(self, key: str) -> int:
        """Modification time in ns; 0 when the backend does not report one."""
        info = self.info(key)
        if "mtime" in info:
            return int(float(info["mtime"]) * 1e9)
        modified = info.get("LastModified") or info.get("last_modified")
        return int(modified.timestamp() * 1e9) if hasattr(modified, "timestamp") else 0

    def list(self, key: str = "") -> list[str]:
        """Immediate children of a folder key, as keys, sorted; [] when it does not exist."""
        path = self.full_path(key)
        if not self.fs.exists(path):
            return []
        return sorted(self.key_of(p) for p in self.fs.ls(path, detail=False) if p != path)

    def walk_files(self, key: str = "") -> Iterator[str]:
        """Every file below a folder key, as keys, sorted."""
        path = self.full_path(key)
        if not self.fs.exists(path):
            return iter(())
        return iter(sorted(self.key_of(p) for p in self.fs.find(path)))

    # -- reads ---------------------------------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        try:
            return self.fs.cat_file(self.full_path(key))
        except FileNotFoundError as exc:
            raise StorageError(f"not found: {self.url_of(key)}") from exc

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key` (fewer at its end): a ranged GET on an object store, where
        `open().read(n)` would fetch a whole default-sized block."""
        path = self.full_path(key)
        try:
            return self.fs.cat_file(path, start=start, end=end)
        except FileNotFoundError as exc:
            raise StorageError(f"not found: {self.url_of(key)}") from exc
        except Exception as exc:
            # Some S3-compatible servers (rclone's `serve s3`) send the whole object's checksum
            # with a ranged GET, and botocore rejects the part it got: read the whole object.
            # Matched by name so this module needs no botocore (local roots never raise it).
            if type(exc).__name__ != "FlexibleChecksumError":
                raise
            return self.fs.cat_file(path)[start:end]

    def read_text(self, key: str, encoding: str = "utf-8") -> str:
        return self.read_bytes(key).decode(encoding)

    def read_json(self, key: str) -> Any:
        try:
            return json.loads(self.read_bytes(key))
        except json.JSONDecodeError as exc:
            raise StorageError(f"{self.url_of(key)} is not valid JSON: {exc}") from exc

    def open(self, key: str, mode: str = "rb"):
        """A file object for streaming reads (writes go through `write_bytes`)."""
        if "w" in mode or "a" in mode:
            raise StorageError("open() is read-only; use write_bytes/write_text for atomic writes")
        return self.fs.open(self.full_path(key), mode)

    # -- writes (atomic) -----------------------------------------------------------------------
    def write_bytes(self, key: str, data: bytes) -> str:
        """Atomically write `data` at `key`; returns the full path."""
        path = self.full_path(key)
        if not self.is_local:
            self.fs.pipe_file(path, data)  # one PUT: readers see the old object or the new one
            return path
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=parent)
        try:
            # mkstemp makes the file 0600; give it the mode `open()` would (0666 less the umask),
            # so a second user or a cluster node's other account can read caches and adapters.
            os.fchmod(fd, 0o666 & ~_UMASK)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def write_text(self, key: str, text: str, encoding: str = "utf-8") -> str:
        return self.write_bytes(key, text.encode(encoding))

    def write_json(self, key: str, value: Any, indent: int | None = 2) -> str:
        text = json.dumps(value, indent=indent, ensure_ascii=False)
        return self.write_text(key, text + ("\n" if indent is not None else ""))

    def append_line(self, key: str, line: str) -> None:
        """Append one line (JSONL logs). Locally a true append; on object stores read+rewrite,
        which is fine for the short per-job logs that use it."""
        if not line.endswith("\n"):
            line += "\n"
        path = self.full_path(key)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line)
            return
        with _REMOTE_APPEND:  # two threads' read+rewrite must not drop each other's line
            old = self.fs.cat_file(path) if self.fs.exists(path) else b""
            self.fs.pipe_file(path, old + line.encode("utf-8"))

    def copy(self, src_key: str, dst_key: str) -> None:
        self.write_bytes(dst_key, self.read_bytes(src_key))

    def delete(self, key: str, recursive: bool = False) -> None:
        path = self.full_path(key)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=recursive)

    def makedirs(self, key: str) -> None:
        self.fs.makedirs(self.full_path(key), exist_ok=True)
