"""What one sample's preprocessing is asked to do, as plain data (no torch: the CLI reads this
module at start-up, and Ray rows carry it as JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# The cache format: in every file's header and in preprocess_meta.json.
FORMAT = "hotstep-ray-preprocess-v1"


@dataclass
class SampleJob:
    """One sample to (re)encode; plain data so it travels through Ray rows as JSON."""

    index: int  # position in the sorted file list (the genre_ratio draw indexes this)
    sample_id: str
    rel_path: str
    audio_path: str  # as dataset.json resolved it
    source_root: str  # Storage root URL to read from
    source_key: str
    stem: str  # output file stem
    src_size: int
    src_mtime_ns: int
    record: dict[str, Any]
    use_genre: bool
    tag_position: str
    pt_metadata: dict[str, Any]
    settings_hash: str
    reason: str = "new"  # new | changed | settings | missing | stale | overwrite

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, default=str)

    @classmethod
    def from_json(cls, text: str) -> SampleJob:
        return cls(**json.loads(text))
