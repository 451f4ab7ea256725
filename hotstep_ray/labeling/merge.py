"""Merge what the analyzers and providers propose into a sample's sidecar fields.

Policies (`MergePolicy` in core.contracts; HOT-Step §3.2):
- `fill_missing` writes a field only when it is empty — and never a field the user edited
  (source `user`), even one the user deliberately left empty;
- `overwrite_caption` / `overwrite_lyrics`: `fill_missing`, plus that one field is replaced;
- `overwrite_all`: every generated field (caption, lyrics, genre, bpm, key, signature,
  is_instrumental) is replaced.
An empty proposal never writes. A caption that arrives as a mapping blob (`{'caption': ...}`)
is unwrapped first.

`is_instrumental` follows the lyrics this merge wrote: lyrics that say "instrumental" (or are only
section tags) set it true and are normalised to `[Instrumental]`; other lyrics set it false.
Absent lyrics never set it, and lyrics that lost the merge leave it alone.

The dataset's declared language is written on every pass, except over a per-sample language the
user edited (source `user`): one Japanese song in an English dataset keeps its `ja`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.core.contracts import FieldSource, MergePolicy
from hotstep_ray.dataset.scan import SOURCED_FIELDS
from hotstep_ray.dataset.sidecar import INSTRUMENTAL_LYRICS

GENERATED_FIELDS: tuple[str, ...] = (
    "caption",
    "lyrics",
    "genre",
    "bpm",
    "key",
    "signature",
    "is_instrumental",
)
_POLICY_OVERWRITES: dict[str, frozenset[str]] = {
    "fill_missing": frozenset(),
    "overwrite_caption": frozenset({"caption"}),
    "overwrite_lyrics": frozenset({"lyrics"}),
    "overwrite_all": frozenset(GENERATED_FIELDS),
}
_SECTION_TAG = re.compile(r"^\[[^\]]*\]$")
_SAYS_INSTRUMENTAL = re.compile(r"this song is an instrumental", re.IGNORECASE)


@dataclass(frozen=True)
class Proposal:
    value: Any
    source: FieldSource


@dataclass
class MergeResult:
    fields: dict[str, Any]  # every sidecar field after the merge (ready for write_sidecar)
    sources: dict[str, FieldSource] = field(default_factory=dict)  # provenance of what changed
    written: list[str] = field(default_factory=list)


def is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def unwrap_caption(value: Any) -> Any:
    """`{'caption': 'x'}` / `{"caption": "x"}` -> `x`; anything else unchanged."""
    if not isinstance(value, str) or not value.strip().startswith("{"):
        return value
    for loads in (json.loads, ast.literal_eval):
        try:
            blob = loads(value.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(blob, dict) and isinstance(blob.get("caption"), str):
            return blob["caption"]
    return value


def lyrics_mean_instrumental(lyrics: str) -> bool:
    """True for "This song is an instrumental" and for lyrics made only of section tags."""
    if _SAYS_INSTRUMENTAL.search(lyrics):
        return True
    lines = [line.strip() for line in lyrics.splitlines() if line.strip()]
    return bool(lines) and all(_SECTION_TAG.match(line) for line in lines)


def may_write(
    name: str,
    policy: MergePolicy,
    current: Mapping[str, Any],
    sources: Mapping[str, str],
) -> bool:
    """Would `policy` let a proposal replace field `name` of this sample?"""
    if name in _POLICY_OVERWRITES[policy]:
        return True
    if sources.get(name) == "user":
        return False
    return is_empty(current.get(name))


def merge_fields(
    current: Mapping[str, Any],
    sources: Mapping[str, str],
    proposals: Mapping[str, Proposal],
    policy: MergePolicy,
    language: str = "",
) -> MergeResult:
    """Apply `proposals` to `current` sidecar fields under `policy` (see the module docstring).

    `sources` is the sample's provenance so far (field -> FieldSource)."""
    fields = dict(current)
    result = MergeResult(fields)

    def write(name: str, value: Any, source: FieldSource) -> None:
        fields[name] = value
        if name in SOURCED_FIELDS:
            result.sources[name] = source
        result.written.append(name)

    for name in GENERATED_FIELDS:
        proposal = proposals.get(name)
        if proposal is None or name == "is_instrumental":
            continue
        value = unwrap_caption(proposal.value) if name == "caption" else proposal.value
        if is_empty(value) or not may_write(name, policy, current, sources):
            continue
        write(name, value.strip() if isinstance(value, str) else value, proposal.source)

    if "lyrics" in result.written:
        instrumental = lyrics_mean_instrumental(str(fields["lyrics"]))
        if instrumental:
            fields["lyrics"] = INSTRUMENTAL_LYRICS
        write("is_instrumental", instrumental, result.sources["lyrics"])

    if language and sources.get("language") != "user":
        # No provenance entry: the language is a dataset setting, not a per-sample label, and a
        # `user` entry here would read as a per-sample edit and pin the value forever.
        fields["language"] = language
        if current.get("language") != language:
            result.written.append("language")
    return result
