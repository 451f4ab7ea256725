"""The header of a safetensors file: 8 bytes of little-endian header length, then that many
bytes of JSON (tensor name -> dtype/shape/offsets, plus an optional `__metadata__` of strings),
then the tensor payload. Read here without loading a tensor: the cache's per-song settings, an
adapter's trigger and identity all live in `__metadata__`."""

from __future__ import annotations

import json
import struct
from typing import Any

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage

# A header larger than this is a corrupt length field, not a real file's JSON.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def _length(head: bytes, where: str) -> int:
    if len(head) < 8:
        raise InputError(f"{where}: not a safetensors file (shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_HEADER_BYTES:
        raise InputError(f"{where}: not a safetensors file (header length {length} out of range)")
    return length


def split(data: bytes, where: str = "safetensors bytes") -> tuple[dict[str, Any], bytes]:
    """(header dict, tensor payload) of a whole file's bytes."""
    length = _length(data, where)
    if 8 + length > len(data):
        raise InputError(f"{where}: truncated (the header runs past the end)")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def read_header(storage: Storage, key: str) -> dict[str, Any]:
    """The header dict of the file at `key`, reading only its bytes: two ranged reads, so an
    object store sends the header, never the tensors."""
    where = storage.url_of(key)
    length = _length(storage.read_range(key, 0, 8), where)
    raw = storage.read_range(key, 8, 8 + length)
    if len(raw) < length:
        raise InputError(f"{where}: truncated (the header runs past the end)")
    return json.loads(raw)


def read_metadata(storage: Storage, key: str) -> dict[str, str]:
    """`__metadata__` of the file at `key` ({} when it has none), reading only its header."""
    return read_header(storage, key).get("__metadata__") or {}


def metadata_of(data: bytes) -> dict[str, str]:
    """`__metadata__` of a whole file's bytes."""
    return split(data)[0].get("__metadata__") or {}
