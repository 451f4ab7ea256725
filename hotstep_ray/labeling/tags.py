"""Who and what a song is: embedded tags first, then the file name, then the dataset's artist.

Genius needs an artist and a title; the seed's order is tags → file-name patterns
(`NN-artist-title`, `artist - title`, `NN. title`) → the dataset's default artist.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

TAG_FIELDS = ("artist", "title", "album", "genre")

_TRACK_NO = r"\d{1,3}"
# "01-artist-title" (no spaces around the dashes: the scene-release style).
_NUMBERED_DASHED = re.compile(rf"^{_TRACK_NO}-(?P<artist>[^-]+)-(?P<title>.+)$")
# "artist - title", optionally behind a track number ("03 artist - title", "03. artist - title").
_SPACED_DASH = re.compile(rf"^(?:{_TRACK_NO}\s*[._)]?\s+)?(?P<artist>.+?)\s+[-–—]\s+(?P<title>.+)$")
# "03. title", "03 title", "03_title".
_NUMBERED_TITLE = re.compile(rf"^{_TRACK_NO}\s*[._)\s-]\s*(?P<title>.+)$")


@dataclass(frozen=True)
class SongIdentity:
    artist: str = ""
    title: str = ""
    origin: str = ""  # "tags" | "filename" | "default" | "" (where the artist came from)


def clean_tags(raw: dict[str, Any]) -> dict[str, str]:
    """The tag fields we keep (artist, title, album, genre), stripped, empties dropped."""
    return {k: str(raw[k]).strip() for k in TAG_FIELDS if raw.get(k) and str(raw[k]).strip()}


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("_", " ")).strip()


def parse_filename(filename: str) -> tuple[str, str]:
    """(artist, title) guessed from a file name; either may be ""."""
    stem = posixpath.splitext(posixpath.basename(filename))[0].strip()
    for pattern in (_NUMBERED_DASHED, _SPACED_DASH):
        match = pattern.match(stem)
        if match:
            return _words(match["artist"]), _words(match["title"])
    match = _NUMBERED_TITLE.match(stem)
    if match:
        return "", _words(match["title"])
    return "", _words(stem)


def identify(tags: dict[str, str], filename: str, default_artist: str = "") -> SongIdentity:
    """Artist and title for a lyrics lookup, in the seed's order of trust."""
    name_artist, name_title = parse_filename(filename)
    title = tags.get("title") or name_title
    if tags.get("artist"):
        return SongIdentity(tags["artist"], title, "tags")
    if name_artist:
        return SongIdentity(name_artist, title, "filename")
    if default_artist.strip():
        return SongIdentity(default_artist.strip(), title, "default")
    return SongIdentity("", title, "")
