"""Calibration prompts: the dataset's own songs, with fixed seeds.

Generation i (0 <= i < seeds) uses song i mod n of the dataset (songs sorted by id, so the choice
does not depend on file order) and seed `base_seed + i`. The caption is the song's caption with
the run's trigger baked in exactly as training rendered it (`lm_data.song_caption`), lyrics as
training normalised them, and the song's bpm / key / time signature / language pinned. Every grid
point (and the base model) gets the same prompts and seeds, so rows differ only by the adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hotstep_ray.audition.schemas import TIME_SIGNATURES
from hotstep_ray.core.errors import InputError
from hotstep_ray.models import prompts as text
from hotstep_ray.training.lm_data import LmSong, song_caption

MAX_CAPTION = 4000  # LmRequest / DitRequest limits
MAX_LYRICS = 20000
FALLBACK_CAPTION = "music"  # DitRequest needs a non-empty caption


@dataclass(frozen=True)
class Prompt:
    song: str  # song id in lm_codes.jsonl
    seed: int
    caption: str
    lyrics: str
    bpm: int | None = None
    keyscale: str | None = None
    timesignature: str | None = None
    language: str = "en"

    def to_dict(self) -> dict[str, Any]:
        """For hot_step_eval.json: the lyrics are the dataset song's, so only their length."""
        out = asdict(self)
        out["lyrics_chars"] = len(out.pop("lyrics"))
        return out

    def metas(self) -> dict[str, Any]:
        """The request fields shared by LmRequest and DitRequest."""
        return {
            "caption": self.caption,
            "lyrics": self.lyrics,
            "bpm": self.bpm,
            "keyscale": self.keyscale,
            "timesignature": self.timesignature,
            "language": self.language,
        }


def _numerator(value: str) -> str | None:
    head = (value or "").strip().split("/")[0]
    return head if head in TIME_SIGNATURES else None


def song_prompts(
    songs: Sequence[LmSong],
    seeds: int,
    base_seed: int,
    trigger: str = "",
    position: str = "prepend",
) -> list[Prompt]:
    """`seeds` prompts cycling over the songs (see the module docstring)."""
    if not songs:
        raise InputError("the dataset has no songs to prompt with")
    ordered = sorted(songs, key=lambda s: s.song_id)
    out = []
    for i in range(seeds):
        song = ordered[i % len(ordered)]
        caption = song_caption(song, trigger, position).strip() or FALLBACK_CAPTION
        keyscale = (song.keyscale or "").strip()
        out.append(
            Prompt(
                song=song.song_id,
                seed=base_seed + i,
                caption=caption[:MAX_CAPTION],
                lyrics=text.normalize_lyrics(song.lyrics, song.instrumental)[:MAX_LYRICS],
                bpm=song.bpm if song.bpm and 30 <= song.bpm <= 300 else None,
                keyscale=keyscale if 0 < len(keyscale) <= 32 else None,
                timesignature=_numerator(song.timesignature),
                language=(song.language or "en")[:16],
            )
        )
    return out
