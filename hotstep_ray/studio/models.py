"""Request bodies only the HTTP API has (the seed's PatchDatasetInput, BulkSetInput, BulkResult).

They follow `core.contracts`: camelCase on the wire, unknown keys refused. Candidates to move into
`core/contracts.py` once another entry point needs them.
"""

from __future__ import annotations

from pydantic import Field

from hotstep_ray.core.contracts import Contract, Options, TagPosition

# Dataset fields a PATCH may not change: identity and where the songs are.
IMMUTABLE_DATASET_FIELDS = frozenset({"id", "slug", "sourceDir", "source_dir"})


class PatchDatasetInput(Options):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    recursive: bool | None = None
    custom_tag: str | None = None
    tag_position: TagPosition | None = None
    genre_ratio: int | None = Field(default=None, ge=0, le=100)
    default_artist: str | None = None
    default_album: str | None = None
    default_genre: str | None = None
    default_language: str | None = None


class BulkSetInput(Options):
    excluded: bool | None = None
    is_instrumental: bool | None = None
    genre: str | None = None
    custom_tag: str | None = None
    language: str | None = None
    repeat: int | None = Field(default=None, ge=1)


class BulkInput(Options):
    sample_ids: list[str] = Field(min_length=1, max_length=5000)
    set: BulkSetInput


class BulkFailure(Contract):
    sample_id: str
    error: str


class BulkResult(Contract):
    updated: int = 0
    failed: list[BulkFailure] = Field(default_factory=list)
