"""Request bodies only the HTTP API has (the seed's PatchDatasetInput, BulkSetInput, BulkResult;
the songs grid's Song and SongPatch).

They follow `core.contracts`: camelCase on the wire, unknown keys refused. Candidates to move into
`core/contracts.py` once another entry point needs them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from hotstep_ray.core.contracts import Contract, Options, Sample, TagPosition
from hotstep_ray.dataset.dataset_json import (
    normalize_keyscale,
    normalize_language,
    normalize_timesignature,
)

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


# -- songs: the page's grid and its edit drawer --------------------------------------------------
# Bounds a saved field must meet to be usable downstream: the audition API's (`audition.schemas`)
# for tempo and text lengths, so any caption saved here can be auditioned as is; the LM planner's
# language codes; the time signatures the model knows (`dataset_json.normalize_timesignature`).
MIN_BPM, MAX_BPM = 30, 300
MAX_CAPTION_CHARS = 4000
MAX_LYRICS_CHARS = 20000
LYRICS_EXCERPT_CHARS = 120
_LANGUAGE_CODE = re.compile(r"^([a-z]{2,3}|unknown)$")


def _cleared(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


class SongPatch(Options):
    """`PATCH /datasets/{id}/songs/{sampleId}`: the fields a musician fixes by hand. A field left
    out is kept; `null` or "" clears it. Values are checked (and key and language normalised)
    before anything is written, so a bad one answers 422 naming the field."""

    caption: str | None = Field(default=None, max_length=MAX_CAPTION_CHARS)
    lyrics: str | None = Field(default=None, max_length=MAX_LYRICS_CHARS)
    bpm: int | None = None
    key: str | None = None
    signature: str | None = None
    language: str | None = None

    @field_validator("bpm", mode="before")
    @classmethod
    def _bpm(cls, value: Any) -> int | None:
        if _cleared(value):
            return None
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int):
            raise PydanticCustomError(
                "bpm",
                "expected a whole number of beats per minute, got {value}",
                {"value": repr(value)},
            )
        if not MIN_BPM <= number <= MAX_BPM:
            raise PydanticCustomError(
                "bpm",
                "{value} is outside {low}..{high} beats per minute",
                {"value": number, "low": MIN_BPM, "high": MAX_BPM},
            )
        return number

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> str | None:
        if _cleared(value):
            return ""
        key = normalize_keyscale(str(value))
        if not key:
            raise PydanticCustomError(
                "key",
                "expected a note and major or minor, e.g. 'C# minor', got {value}",
                {"value": repr(value)},
            )
        return key

    @field_validator("signature", mode="before")
    @classmethod
    def _signature(cls, value: Any) -> str | None:
        if _cleared(value):
            return ""
        text = str(value).strip()
        if not normalize_timesignature(text):
            raise PydanticCustomError(
                "signature",
                "expected 2, 3, 4 or 6 beats per bar, e.g. '4/4' or '6/8', got {value}",
                {"value": repr(value)},
            )
        return text  # as written: Side-Step keeps it verbatim

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: Any) -> str | None:
        if _cleared(value):
            return ""
        code = normalize_language(str(value))
        if not _LANGUAGE_CODE.match(code):
            raise PydanticCustomError(
                "language",
                "expected a language code such as 'en' or a name such as 'English', got {value}",
                {"value": repr(value)},
            )
        return code


class Song(Contract):
    """One row of a dataset's songs grid (`GET /datasets/{id}/songs`); with `lyrics` in full
    when it is one song (`GET`/`PATCH /datasets/{id}/songs/{sampleId}`)."""

    sample_id: str
    file: str  # the path relative to the songs folder
    duration: float = 0.0  # seconds
    bpm: int | None = None
    key: str = ""
    signature: str = ""
    language: str = ""
    genre: str = ""
    caption: str = ""
    lyrics_excerpt: str = ""
    lyrics: str | None = None
    is_instrumental: bool = False
    label_status: str = "unlabeled"
    error: str = ""
    excluded: bool = False
    file_missing: bool = False
    sidecar_exists: bool = False
    sources: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, sample: Sample, full: bool = False) -> Song:
        lyrics = sample.lyrics or ""
        excerpt = " / ".join(line.strip() for line in lyrics.splitlines() if line.strip())
        if len(excerpt) > LYRICS_EXCERPT_CHARS:
            excerpt = excerpt[: LYRICS_EXCERPT_CHARS - 1].rstrip() + "…"
        return cls(
            sample_id=sample.sample_id,
            file=sample.rel_path,
            duration=sample.duration,
            bpm=sample.bpm,
            key=sample.key,
            signature=sample.signature,
            language=sample.language,
            genre=sample.genre,
            caption=sample.caption,
            lyrics_excerpt=excerpt,
            lyrics=lyrics if full else None,
            is_instrumental=sample.is_instrumental,
            label_status=sample.label_status,
            error=sample.error,
            excluded=sample.excluded,
            file_missing=sample.file_missing,
            sidecar_exists=sample.sidecar_exists,
            sources=dict(sample.sources),
        )
