"""The MM3 tensor cache (one file per song) and seam-aware training crops.

    tensors/<slug>/<variant_key>/          variant_key = mm3-<mode>-s<seed> (e.g. mm3-sampled-s42)
      <stem>.safetensors    latents [128, L] f32 (channel-major DAV means, 86.13 Hz)
                            condition [Lc, C] f16 (latent-major, post condition encoder)
                            span_starts, span_ends [n] int64 (latent spans of the segments)
                            __metadata__["json"]: the sample's facts (prompt, rates, rollouts)
      mm3_cache.json        manifest: kind, version, settings, per-sample entries

A crop of `crop` latents starting at r is VALID when it lies inside one segment's span and inside
the usable length min(L, Lc): a crop across a seam would pair continuous audio with conditioning
that jumps to an unrelated rollout (seed trap 17), and one past an early-EOS segment end has no
conditioning. Random crops draw r uniformly in [0, usable - crop] and REJECT and redraw invalid
ones (HOT-Step's rule, generalised from "no seam inside" to "inside a span"); after
`MAX_REDRAWS` the draw falls back to a uniform pick among valid starts, so a song whose spans
barely fit a crop still trains. Songs without any valid crop are skipped with a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3.options import CropMode

FORMAT = "hotstep-ray-mm3-cache-v1"
MANIFEST = layout.MM3_CACHE_MANIFEST
MAX_REDRAWS = 1000


# -- files ----------------------------------------------------------------------------------------
def song_bytes(
    latents: torch.Tensor,
    meta: dict[str, Any],
    condition: torch.Tensor | None = None,
    span_starts: list[int] | None = None,
    span_ends: list[int] | None = None,
) -> bytes:
    """One song's safetensors bytes; without `condition` it is the DAV-only intermediate."""
    tensors = {"latents": latents.float().contiguous()}
    if condition is not None:
        tensors["condition"] = condition.to(torch.float16).contiguous()
        tensors["span_starts"] = torch.tensor(span_starts or [], dtype=torch.int64)
        tensors["span_ends"] = torch.tensor(span_ends or [], dtype=torch.int64)
    header = {"format": FORMAT, "json": json.dumps(meta, ensure_ascii=False, sort_keys=True)}
    return save_safetensors(tensors, metadata=header)


def read_song_file(storage: Storage, key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    data = storage.read_bytes(key)
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    meta = json.loads((header.get("__metadata__") or {}).get("json", "{}"))
    return load_safetensors(data), meta


@dataclass(frozen=True, eq=False)  # identity equality: fields are tensors
class Song:
    stem: str
    latents: torch.Tensor  # [128, L] float32
    condition: torch.Tensor  # [Lc, C] float16
    spans: tuple[tuple[int, int], ...]  # (start, end) latent spans, clipped to `usable`

    @property
    def usable(self) -> int:
        return min(int(self.latents.shape[1]), int(self.condition.shape[0]))


def make_song(stem: str, tensors: dict[str, torch.Tensor]) -> Song:
    latents, condition = tensors["latents"], tensors["condition"]
    usable = min(int(latents.shape[1]), int(condition.shape[0]))
    spans = tuple(
        (int(s), min(int(e), usable))
        for s, e in zip(tensors["span_starts"].tolist(), tensors["span_ends"].tolist(), strict=True)
        if min(int(e), usable) > int(s)
    )
    return Song(stem, latents, condition, spans)


def load_songs(storage: Storage, tensor_dir: str) -> list[Song]:
    """Every good song of a cache folder, in manifest order."""
    manifest_key = f"{tensor_dir}/{MANIFEST}"
    if not storage.exists(manifest_key):
        raise InputError(
            f"no MM3 cache at {storage.url_of(tensor_dir)}: run `mm3 preprocess` first"
        )
    manifest = storage.read_json(manifest_key)
    songs = []
    for entry in manifest.get("samples", []):
        if entry.get("ok"):
            tensors, _ = read_song_file(storage, f"{tensor_dir}/{entry['file']}")
            songs.append(make_song(entry["stem"], tensors))
    if not songs:
        raise InputError(f"the MM3 cache at {storage.url_of(tensor_dir)} holds no usable song")
    return songs


# -- crops ----------------------------------------------------------------------------------------
def crop_is_valid(spans: tuple[tuple[int, int], ...], start: int, crop: int) -> bool:
    """True when [start, start + crop) lies inside one span (no seam, no uncovered latent)."""
    return any(s <= start and start + crop <= e for s, e in spans)


def valid_starts(spans: tuple[tuple[int, int], ...], crop: int) -> list[range]:
    return [range(s, e - crop + 1) for s, e in spans if e - s >= crop]


def has_valid_crop(song: Song, crop: int) -> bool:
    return bool(valid_starts(song.spans, crop))


@dataclass
class CropStats:
    draws: int = 0
    rejected: int = 0  # draws that straddled a seam or left the conditioned spans
    fallbacks: int = 0


def draw_crop(
    song: Song,
    crop: int,
    gen: torch.Generator,
    mode: CropMode = "random",
    stats: CropStats | None = None,
) -> int:
    """A valid crop start for `song` (see the module docstring). `beginning` still consumes one
    draw so both modes see the same random stream."""
    ranges = valid_starts(song.spans, crop)
    if not ranges:
        raise InputError(f"{song.stem}: no {crop}-latent crop fits inside one conditioning segment")
    stats = stats if stats is not None else CropStats()
    high = song.usable - crop + 1  # starts 0 .. usable - crop
    first = int(torch.randint(high, (1,), generator=gen))
    stats.draws += 1
    if mode == "beginning":
        return ranges[0].start
    start = first
    for _ in range(MAX_REDRAWS):
        if crop_is_valid(song.spans, start, crop):
            return start
        stats.rejected += 1
        start = int(torch.randint(high, (1,), generator=gen))
        stats.draws += 1
    stats.fallbacks += 1
    total = sum(len(r) for r in ranges)
    pick = int(torch.randint(total, (1,), generator=gen))
    for r in ranges:
        if pick < len(r):
            return r[pick]
        pick -= len(r)
    raise AssertionError("unreachable")


def crop_tensors(song: Song, start: int, crop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x0 [128, crop] float32, condition [crop, C] float32) of one crop."""
    x0 = song.latents[:, start : start + crop].float()
    return x0, song.condition[start : start + crop].float()
