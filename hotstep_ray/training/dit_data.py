"""DiT training data: the tensor cache -> per-step random crops -> padded micro-batches.

The cache of one dataset variant (`tensors/<slug>/<variant_key>/`, written by the preprocess
stage) holds one `<stem>.safetensors` per song. `read_song` is the ONLY place that knows the
tensor names (a rename in the preprocess stage is a one-line change in `TENSOR_NAMES`):

    target_latents          [T, 64]    VAE latents x0 at 25 Hz
    context_latents         [T, 128]   [source latents | chunk mask] for the DiT input
    encoder_hidden_states   [L, H_enc] packed condition (lyrics | timbre | caption)
    encoder_attention_mask  [L]        1 = real condition token
    encoder_hidden_states_genre, encoder_attention_mask_genre   optional genre-prompt variant

Per-song `repeat` comes from the `samples` entry of `preprocess_meta.json` when it has one, else
from the file's `__metadata__["repeat"]`, else 1; the trigger word from the files' `custom_tag` /
`tag_position` metadata. `channel_stats.json` (`channel_std[64]`) feeds channel balance; when it
is missing the statistics are computed from the songs.

Genre. When a song carries the genre variant, each crop uses it with probability
`genre_ratio` % (HOT-Step's per-step rule). When no song carries one the preprocess stage has
already applied the ratio (the genre prompt baked into the caption of that share of songs) and the
trainer does nothing more.

Sampling. An epoch lists every song `repeat` times, shuffled (`order="shuffle"`) with a seed
derived from (seed, epoch), and deals the list into micro-batches of up to B DIFFERENT songs. A
crop is a window of `crop` frames starting at a uniformly drawn even frame (so patch boundaries
match the full-song grid); a song shorter than the crop is taken whole and padded. Every tensor of
a micro-batch is right-padded to fixed sizes (the run's crop length and the cache's longest
condition), so shapes are static across steps; the masks say what is real.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes

from hotstep_ray.core import layout, safetensors_header
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.acestep_ops import TrainBatch

TENSOR_NAMES = {
    "target": "target_latents",
    "context": "context_latents",
    "condition": "encoder_hidden_states",
    "condition_mask": "encoder_attention_mask",
    "genre_condition": "encoder_hidden_states_genre",
    "genre_mask": "encoder_attention_mask_genre",
}
META_FILE = layout.PREPROCESS_META_FILE
STATS_FILE = "channel_stats.json"
LATENT_CHANNELS = 64


@dataclass(frozen=True)
class Song:
    """One cached song, tensors in their stored dtype on the CPU."""

    stem: str
    target: torch.Tensor  # [T, 64]
    context: torch.Tensor  # [T, 128]
    condition: torch.Tensor  # [L, H_enc]
    condition_mask: torch.Tensor  # [L] bool
    genre_condition: torch.Tensor | None = None  # [Lg, H_enc]
    genre_mask: torch.Tensor | None = None  # [Lg] bool
    repeat: int = 1
    custom_tag: str = ""  # the trigger word baked into this song's caption
    tag_position: str = ""

    @property
    def frames(self) -> int:
        return int(self.target.shape[0])

    @property
    def has_genre(self) -> bool:
        return self.genre_condition is not None


def read_song(data: bytes, stem: str, repeat: int | None = None) -> Song:
    """Parse one `<stem>.safetensors` payload (see the module docstring for the names)."""
    tensors = load_safetensors_bytes(data)
    header_len = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + header_len]).get("__metadata__") or {}
    missing = [
        name for key, name in TENSOR_NAMES.items() if "genre" not in key and name not in tensors
    ]
    if missing:
        raise InputError(f"{stem}.safetensors lacks {missing}; re-run preprocess for this variant")
    target = tensors[TENSOR_NAMES["target"]]
    context = tensors[TENSOR_NAMES["context"]]
    condition = tensors[TENSOR_NAMES["condition"]]
    mask = tensors[TENSOR_NAMES["condition_mask"]].to(torch.bool)
    if target.ndim != 2 or target.shape[1] != LATENT_CHANNELS:
        raise InputError(f"{stem}: target_latents must be [T, 64], got {tuple(target.shape)}")
    if tuple(context.shape) != (target.shape[0], 2 * LATENT_CHANNELS):
        raise InputError(
            f"{stem}: context_latents {tuple(context.shape)} != [T={target.shape[0]}, 128]"
        )
    if condition.ndim != 2 or tuple(mask.shape) != (condition.shape[0],):
        raise InputError(f"{stem}: condition {tuple(condition.shape)} / mask {tuple(mask.shape)}")
    genre = tensors.get(TENSOR_NAMES["genre_condition"])
    genre_mask = tensors.get(TENSOR_NAMES["genre_mask"])
    if genre is not None and genre_mask is None:
        genre_mask = torch.ones(genre.shape[0], dtype=torch.bool)
    if repeat is None:
        repeat = int(metadata.get("repeat", 1))
    return Song(
        stem=stem,
        target=target,
        context=context,
        condition=condition,
        condition_mask=mask,
        genre_condition=genre,
        genre_mask=None if genre_mask is None else genre_mask.to(torch.bool),
        repeat=max(1, repeat),
        custom_tag=str(metadata.get("custom_tag", "")),
        tag_position=str(metadata.get("tag_position", "")),
    )


def _meta_repeats(meta: dict[str, Any]) -> dict[str, int]:
    """`samples` as {stem: {...}} or [{"file"|"stem"|"sample_id": ..., "repeat": n}] ->
    {stem: n}, for the entries that carry a repeat."""
    samples = meta.get("samples") or {}
    rows = samples.items() if isinstance(samples, dict) else ((None, row) for row in samples)
    repeats = {}
    for stem, row in rows:
        if not isinstance(row, dict) or "repeat" not in row:
            continue
        name = stem or str(row.get("file") or "").removesuffix(".safetensors")
        name = name or row.get("stem") or row.get("sample_id")
        if name:
            repeats[str(name)] = int(row["repeat"])
    return repeats


@dataclass
class TensorCache:
    songs: list[Song]
    channel_std: torch.Tensor  # [64] float32, population std over every frame
    channel_stats_source: str  # "file" | "computed"
    meta: dict[str, Any]  # preprocess_meta.json ({} when absent)

    @property
    def longest(self) -> int:
        return max(song.frames for song in self.songs)

    @property
    def shortest(self) -> int:
        return min(song.frames for song in self.songs)

    @property
    def condition_len(self) -> int:
        """Longest condition (either variant): every micro-batch is padded to it."""
        lengths = [s.condition.shape[0] for s in self.songs]
        lengths += [s.genre_condition.shape[0] for s in self.songs if s.genre_condition is not None]
        return max(lengths)

    @property
    def condition_dim(self) -> int:
        return int(self.songs[0].condition.shape[1])

    @property
    def genre_songs(self) -> int:
        return sum(song.has_genre for song in self.songs)

    @property
    def repeats(self) -> list[int]:
        return [song.repeat for song in self.songs]

    @property
    def samples(self) -> int:
        """Crops per epoch: every song `repeat` times."""
        return sum(self.repeats)

    def trigger(self) -> tuple[str | None, str]:
        """(trigger word, position) the tensors were made with: the meta's `custom_tag` /
        `tag_position`, else the most common tag of the songs."""
        if self.meta.get("custom_tag"):
            return str(self.meta["custom_tag"]), str(self.meta.get("tag_position") or "prepend")
        tags = Counter((s.custom_tag, s.tag_position) for s in self.songs if s.custom_tag)
        if not tags:
            return None, str(self.meta.get("tag_position") or "prepend")
        (tag, position), _ = tags.most_common(1)[0]
        return tag, position or "prepend"

    def summary(self) -> dict[str, Any]:
        return {
            "songs": len(self.songs),
            "samples": self.samples,
            "min_frames": self.shortest,
            "max_frames": self.longest,
            "condition_len": self.condition_len,
            "genre_songs": self.genre_songs,
            "channel_stats": self.channel_stats_source,
        }


def channel_std_from_songs(songs: Sequence[Song]) -> torch.Tensor:
    """Population std per latent channel over every frame of every song (float64 sums)."""
    total = torch.zeros(LATENT_CHANNELS, dtype=torch.float64)
    squares = torch.zeros(LATENT_CHANNELS, dtype=torch.float64)
    count = 0
    for song in songs:
        x = song.target.double()
        total += x.sum(dim=0)
        squares += x.square().sum(dim=0)
        count += x.shape[0]
    mean = total / count
    return (squares / count - mean.square()).clamp_min(0).sqrt().float()


def load_cache(storage: Storage, key: str) -> TensorCache:
    """Every `<stem>.safetensors` under `key` (sorted by stem), plus meta and channel stats."""
    meta = storage.read_json(f"{key}/{META_FILE}") if storage.exists(f"{key}/{META_FILE}") else {}
    repeats = _meta_repeats(meta)
    songs = []
    for file_key in storage.list(key):
        name = file_key.rsplit("/", 1)[-1]
        if not name.endswith(".safetensors") or name.startswith("."):
            continue
        stem = name[: -len(".safetensors")]
        data = storage.read_bytes(file_key)
        songs.append(read_song(data, stem, repeats.get(stem) if stem in repeats else None))
    if not songs:
        raise InputError(
            f"no cached songs in {storage.url_of(key)}: run `hotstep-ray preprocess` for this "
            "dataset and variant first"
        )
    dims = {song.condition.shape[1] for song in songs}
    if len(dims) != 1:
        raise InputError(f"songs in {storage.url_of(key)} mix condition widths {sorted(dims)}")
    source = "computed"
    channel_std = None
    if storage.exists(f"{key}/{STATS_FILE}"):
        stats = storage.read_json(f"{key}/{STATS_FILE}")
        if len(stats.get("channel_std", [])) == LATENT_CHANNELS:
            channel_std, source = torch.tensor(stats["channel_std"], dtype=torch.float32), "file"
    if channel_std is None:
        channel_std = channel_std_from_songs(songs)
    return TensorCache(songs=songs, channel_std=channel_std, channel_stats_source=source, meta=meta)


# -- seeded streams ------------------------------------------------------------------------------
def derived_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of ints/strings: independent, reproducible streams for
    (seed, epoch), (seed, step, rank), ... so a resumed run redraws exactly what it would have."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator(*parts: Any, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derived_seed(*parts))


# -- epoch plan ----------------------------------------------------------------------------------
def plan_epoch(
    repeats: Sequence[int], batch: int, seed: int, epoch: int, order: str = "shuffle"
) -> list[tuple[int, ...]]:
    """Micro-batches of song indices for one epoch: every song `repeats[i]` times, each
    micro-batch holding up to `batch` DIFFERENT songs (a song repeated more often than the others
    ends up in smaller micro-batches at the tail rather than twice in one)."""
    entries = [song for song, count in enumerate(repeats) for _ in range(count)]
    if order == "shuffle":
        permutation = torch.randperm(len(entries), generator=generator(seed, "epoch", epoch))
        entries = [entries[i] for i in permutation.tolist()]
    elif order != "sequential":
        raise InputError(f"order must be shuffle or sequential, got {order!r}")
    micro_batches: list[tuple[int, ...]] = []
    pending = entries
    while pending:
        chosen: list[int] = []
        rest: list[int] = []
        for song in pending:
            if len(chosen) < batch and song not in chosen:
                chosen.append(song)
            else:
                rest.append(song)
        micro_batches.append(tuple(chosen))
        pending = rest
    return micro_batches


def shard_plan(plan: list[tuple[int, ...]], rank: int, world_size: int) -> list[tuple[int, ...]]:
    """Rank `rank`'s micro-batches (round robin). The plan is wrapped to a multiple of
    `world_size` first, so every rank runs the same number of steps (the gradient all-reduce is a
    collective)."""
    if world_size <= 1:
        return plan
    padded = plan + plan[: (-len(plan)) % world_size]
    return padded[rank::world_size]


def windows(plan: list[tuple[int, ...]], grad_accum: int) -> list[list[tuple[int, ...]]]:
    """Optimizer windows: `grad_accum` micro-batches each, the last one possibly shorter."""
    return [plan[i : i + grad_accum] for i in range(0, len(plan), grad_accum)]


# -- crops and assembly --------------------------------------------------------------------------
@dataclass(frozen=True)
class Crop:
    song: int  # index into TensorCache.songs
    start: int  # first frame (even)
    frames: int  # real frames taken: min(crop, song length)
    genre: bool  # use the genre condition variant


def draw_crop(
    song: Song, song_index: int, crop: int, genre_ratio: float, rng: torch.Generator, patch: int = 2
) -> Crop:
    """A uniformly drawn window start, aligned to `patch`, then the genre coin (always drawn, so
    the stream does not depend on which songs carry a genre variant)."""
    slack = song.frames - crop
    starts = slack // patch + 1 if slack > 0 else 1
    start = int(torch.randint(starts, (1,), generator=rng)) * patch
    coin = float(torch.rand((), generator=rng))
    return Crop(
        song=song_index,
        start=start,
        frames=min(crop, song.frames),
        genre=song.has_genre and coin < genre_ratio / 100.0,
    )


def batch_frames(cache: TensorCache, crop: int) -> int:
    """Fixed frame length of every micro-batch: the crop, or the longest song when shorter."""
    return min(crop, cache.longest)


def assemble(
    cache: TensorCache,
    crops: Sequence[Crop],
    frames: int,
    condition_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    pin_memory: bool = False,
) -> TrainBatch:
    """Stack crops into one right-padded `TrainBatch` on the CPU (`pin_memory`: in page-locked
    memory, whose copy to the GPU is truly asynchronous; needs CUDA).

    Shapes: target [B, frames, 64], context [B, frames, 128], condition [B, L, H_enc] with
    L = `condition_len` (default: the cache's longest). Padding is zeros; `latent_mask` /
    `encoder_attention_mask` are None when nothing in the batch is padded (the unmasked fast
    path), else bool masks with True = real.
    """
    size, length = len(crops), condition_len or cache.condition_len
    width = cache.condition_dim
    pin = {"pin_memory": pin_memory}
    target = torch.zeros(size, frames, LATENT_CHANNELS, dtype=dtype, **pin)
    context = torch.zeros(size, frames, 2 * LATENT_CHANNELS, dtype=dtype, **pin)
    condition = torch.zeros(size, length, width, dtype=dtype, **pin)
    frame_mask = torch.zeros(size, frames, dtype=torch.bool, **pin)
    condition_mask = torch.zeros(size, length, dtype=torch.bool, **pin)
    for row, crop in enumerate(crops):
        song = cache.songs[crop.song]
        window = slice(crop.start, crop.start + crop.frames)
        target[row, : crop.frames] = song.target[window].to(dtype)
        context[row, : crop.frames] = song.context[window].to(dtype)
        frame_mask[row, : crop.frames] = True
        tokens, mask = song.condition, song.condition_mask
        if crop.genre:
            tokens, mask = song.genre_condition, song.genre_mask
        condition[row, : tokens.shape[0]] = tokens.to(dtype)
        condition_mask[row, : tokens.shape[0]] = mask
    return TrainBatch(
        target_latents=target,
        encoder_hidden_states=condition,
        context_latents=context,
        latent_mask=None if bool(frame_mask.all()) else frame_mask,
        encoder_attention_mask=None if bool(condition_mask.all()) else condition_mask,
    )


@dataclass(frozen=True)
class CacheShapes:
    """What the memory model needs, read from the safetensors headers only (no tensor data)."""

    songs: int
    samples: int
    longest: int
    condition_len: int


def _cached_songs(storage: Storage, folder: str) -> list[str]:
    return [
        key
        for key in storage.list(folder)
        if key.endswith(".safetensors") and not key.rsplit("/", 1)[-1].startswith(".")
    ]


def cached_variants(storage: Storage, slug: str) -> dict[str, list[str]]:
    """{variant: its song keys} for the dataset's ACE-Step caches under `tensors/<slug>/`:
    folders with at least one song, not hidden, not an MM3 cache (another model's tensors)."""
    parent = layout.dataset_tensors(slug)
    found = {}
    for folder in storage.list(parent):
        name = folder.rsplit("/", 1)[-1]
        if name.startswith(".") or storage.exists(f"{folder}/{layout.MM3_CACHE_MANIFEST}"):
            continue
        if songs := _cached_songs(storage, folder):
            found[name] = songs
    return found


def pick_variant(storage: Storage, slug: str, variant: str | None = None) -> str:
    """The tensor-cache variant to train or render with: the one asked for, else the dataset's
    most recently written one (by its newest song file: object stores give folders no time)."""
    if variant:
        return variant
    newest = {
        name: max(storage.mtime_ns(key) for key in songs)
        for name, songs in cached_variants(storage, slug).items()
    }
    if not newest:
        raise InputError(
            f"dataset {slug!r} has no tensor cache under "
            f"{storage.url_of(layout.dataset_tensors(slug))}: "
            f"run `hotstep-ray preprocess {slug}` first"
        )
    return max(sorted(newest), key=newest.__getitem__)


def scan_cache(storage: Storage, key: str) -> CacheShapes:
    meta = storage.read_json(f"{key}/{META_FILE}") if storage.exists(f"{key}/{META_FILE}") else {}
    repeats = _meta_repeats(meta)
    songs = samples = longest = condition_len = 0
    for file_key in storage.list(key):
        name = file_key.rsplit("/", 1)[-1]
        if not name.endswith(".safetensors") or name.startswith("."):
            continue
        header = safetensors_header.read_header(storage, file_key)  # shapes only, no tensors
        stem = name[: -len(".safetensors")]
        repeat = repeats.get(stem, int((header.get("__metadata__") or {}).get("repeat", 1)))
        songs, samples = songs + 1, samples + max(1, repeat)
        longest = max(longest, header[TENSOR_NAMES["target"]]["shape"][0])
        for tensor in (TENSOR_NAMES["condition"], TENSOR_NAMES["genre_condition"]):
            if tensor in header:
                condition_len = max(condition_len, header[tensor]["shape"][0])
    if not songs:
        raise InputError(f"no cached songs in {storage.url_of(key)}: run preprocess first")
    return CacheShapes(songs, samples, longest, condition_len)


def _map(batch: TrainBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
    def apply(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else fn(t)

    return TrainBatch(
        target_latents=apply(batch.target_latents),
        encoder_hidden_states=apply(batch.encoder_hidden_states),
        context_latents=apply(batch.context_latents),
        latent_mask=apply(batch.latent_mask),
        encoder_attention_mask=apply(batch.encoder_attention_mask),
    )


def batch_to(batch: TrainBatch, device: torch.device, non_blocking: bool = True) -> TrainBatch:
    return _map(batch, lambda t: t.to(device, non_blocking=non_blocking))


def valid_frames(batch: TrainBatch) -> int:
    if batch.latent_mask is None:
        return int(batch.target_latents.shape[0] * batch.target_latents.shape[1])
    return int(batch.latent_mask.sum())


def resolve_dit_folder(
    meta: dict[str, Any], variant_key: str, dit_folder: str | None, checkpoints_dir: str | None
) -> Path:
    """The base DiT comes from the cache's `preprocess_meta.json` (the model the tensors were made
    with), not from the request: an explicit folder, else the recorded `models.dit` / `dit_path`,
    else `dit_model`/`model_variant` under the checkpoints folder, else
    `<checkpoints>/<variant_key>` or `acestep-v15-<variant_key>`."""
    tried: list[str] = []
    candidates: list[Path] = []
    if dit_folder:
        candidates.append(Path(dit_folder))
    models = meta.get("models") if isinstance(meta.get("models"), dict) else {}
    for recorded in (meta.get("dit_path"), models.get("dit")):
        if recorded:
            candidates.append(Path(str(recorded)))
    if checkpoints_dir:
        root = Path(checkpoints_dir)
        for name_key in ("dit_model", "model_variant", "dit"):
            if meta.get(name_key):
                candidates.append(root / Path(str(meta[name_key])).name)
        candidates += [root / variant_key, root / f"acestep-v15-{variant_key}"]
    for folder in candidates:
        tried.append(str(folder))
        if folder.is_dir():
            return folder
    raise InputError(
        "cannot find the DiT these tensors were made with; tried "
        + (", ".join(tried) or "nothing (give --checkpoints or --dit)")
    )
