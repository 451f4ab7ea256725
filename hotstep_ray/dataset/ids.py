"""Stable ids derived from a sample's path relative to the dataset source folder.

Both ids hash the same string, so a sample keeps its id across rescans, machines and operating
systems: the relative path with forward slashes, lower-cased (Windows and macOS folders are
case-insensitive, and HOT-Step hashes the lower-cased form too).
"""

from __future__ import annotations

import hashlib


def canonical_rel_path(rel_path: str) -> str:
    """The string both ids hash: forward slashes, lower case."""
    return rel_path.replace("\\", "/").lower()


def _sha1_hex(rel_path: str) -> str:
    return hashlib.sha1(canonical_rel_path(rel_path).encode("utf-8")).hexdigest()


def sample_id(rel_path: str) -> str:
    """Studio sample id: the first 16 hex digits of sha1 of the canonical relative path."""
    return _sha1_hex(rel_path)[:16]


def dataset_json_id(rel_path: str) -> str:
    """`id` of a sample record in `dataset.json`: the first 8 hex digits of the same sha1."""
    return _sha1_hex(rel_path)[:8]
