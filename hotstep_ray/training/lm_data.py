"""5 Hz LM training data: `lm_codes.jsonl` rows -> token sequences in the trained layout -> batches.

A song becomes the chat the LM was trained on, rendered by the tokenizer's own template from
[system, user = caption + lyrics, assistant = CoT + codes] (`lm_tokenizer.render_training_sequence`):

    <|im_start|>system\\n…<|im_end|>\\n<|im_start|>user\\n# Caption\\n{caption}\\n\\n# Lyric\\n{lyrics}\\n
    <|im_end|>\\n<|im_start|>assistant\\n<think>\\n{yaml}\\n</think>\\n\\n<|audio_code_N|>…<|im_end|>\\n

The caption carries the trigger word exactly as the DiT path bakes it in (`prompts.apply_custom_tag`).
Loss targets are the completion: from `<think>` (`loss_on_cot`, the default) or from the first code,
through the closing `<|im_end|>`; the template's trailing "\\n" stays in the sequence (it conditions
nothing) but is not a target. A song longer than `max_len` tokens is skipped and reported, never
truncated.

Batches. A micro-batch is `[R, T]` token rows; each row holds one or more whole songs followed by
right padding. Position ids restart at 0 for every song (pads continue the last song's count), so
attention is per-document: transformers turns restarting position ids into a block-diagonal causal
mask (SDPA, flex) and the `varlen` attention in `lm_loss` reads the same boundaries as `cu_seqlens`.
Modes: `single` (one song per step, the seed), `bucket` (B songs of similar length, padded) and
`pack` (songs first-fit-decreasing into rows of `pack_tokens`). Groups are fixed for the run and
their order is shuffled per epoch, so every epoch has the same number of optimizer steps.

The trainer's `extract` stage (`extract_codes`) writes `lm_codes.jsonl` from the tensor cache, reusing
every row whose tensor file is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import LogitsProcessor, PreTrainedTokenizerBase

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import LmBatching
from hotstep_ray.core.errors import InputError
from hotstep_ray.models import lm_tokenizer, prompts

CODES_FILE = layout.LM_CODES_FILE
CODE_HZ = 5  # codes per second of audio
# Column names of `lm_codes.jsonl` (preprocess writes it); first present name wins. A rename in the
# writer is a one-line change here.
COLUMNS: dict[str, tuple[str, ...]] = {
    "id": ("id", "sample_id", "_id"),
    "file": ("file", "filename"),
    "caption": ("caption",),
    "lyrics": ("lyrics",),
    "codes": ("codes", "audio_codes"),
    "bpm": ("bpm",),
    "keyscale": ("keyscale", "key"),
    "timesignature": ("timesignature", "time_signature", "signature"),
    "language": ("language",),
    "duration": ("duration", "duration_s"),
    "genre": ("genre",),
    "repeat": ("repeat",),
    "instrumental": ("is_instrumental", "instrumental"),
    "custom_tag": ("custom_tag", "trigger"),
    "tag_position": ("tag_position",),
    "trigger_applied": ("trigger_applied", "caption_tagged"),
}
Batching = LmBatching
IGNORE = -100


# -- reading lm_codes.jsonl ----------------------------------------------------------------------
@dataclass(frozen=True)
class LmSong:
    """One row of `lm_codes.jsonl`: the song's metas and its 5 Hz codes (0 <= N < 64000)."""

    song_id: str
    caption: str
    lyrics: str
    codes: tuple[int, ...]
    bpm: int | None = None
    keyscale: str = ""
    timesignature: str = ""
    language: str = ""
    duration: float | None = None  # seconds; None = len(codes) / 5
    instrumental: bool = False
    custom_tag: str = ""  # a per-song trigger; "" = the run's trigger
    tag_position: str = ""  # "" = the run's position
    trigger_applied: bool = False  # the writer already baked the trigger into `caption`
    genre: str = ""  # stands in for an empty caption
    repeat: int = 1  # times the song is seen per epoch


@dataclass(frozen=True)
class SkippedSong:
    song_id: str
    reason: Literal["bad-row", "invalid-codes", "no-codes", "too-long"]
    detail: str = ""
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.song_id,
            "reason": self.reason,
            "detail": self.detail,
            "tokens": self.tokens,
        }


def _column(row: dict[str, Any], name: str, default: Any = None) -> Any:
    for key in COLUMNS[name]:
        if key in row and row[key] is not None:
            return row[key]
    return default


def _int_or_none(value: Any) -> int | None:
    try:
        number = int(float(value))
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def parse_song(row: dict[str, Any], index: int) -> LmSong | SkippedSong:
    """A row -> LmSong, or SkippedSong when its codes are missing or outside 0..63999."""
    file = _column(row, "file")
    song_id = str(_column(row, "id", Path(str(file)).stem if file else f"row-{index}"))
    codes = _column(row, "codes")
    if isinstance(codes, str):  # "<|audio_code_1|><|audio_code_2|>…"
        codes = lm_tokenizer.parse_audio_codes(codes)
    if not isinstance(codes, list) or not codes:
        return SkippedSong(song_id, "no-codes", "row has no codes")
    try:
        values = tuple(int(c) for c in codes)
    except (TypeError, ValueError):
        return SkippedSong(song_id, "invalid-codes", "codes are not integers")
    bad = [c for c in values if not 0 <= c < lm_tokenizer.NUM_VALID_AUDIO_CODES]
    if bad:
        return SkippedSong(song_id, "invalid-codes", f"{len(bad)} codes outside 0..63999")
    ts = _column(row, "timesignature", "")
    duration = _column(row, "duration")
    return LmSong(
        song_id=song_id,
        caption=str(_column(row, "caption", "")),
        lyrics=str(_column(row, "lyrics", "")),
        codes=values,
        bpm=_int_or_none(_column(row, "bpm")),
        keyscale=str(_column(row, "keyscale", "")).strip(),
        timesignature=str(ts).strip(),
        language=str(_column(row, "language", "")).strip(),
        duration=float(duration) if _int_or_none(duration) else None,
        instrumental=bool(_column(row, "instrumental", False)),
        custom_tag=str(_column(row, "custom_tag", "")),
        tag_position=str(_column(row, "tag_position", "")),
        trigger_applied=bool(_column(row, "trigger_applied", False)),
        genre=str(_column(row, "genre", "")),
        repeat=max(1, _int_or_none(_column(row, "repeat", 1)) or 1),
    )


def read_lm_codes(lines: Iterable[str]) -> tuple[list[LmSong], list[SkippedSong]]:
    """Parse JSONL text lines; unreadable rows are skipped and reported, never fatal."""
    songs: list[LmSong] = []
    skipped: list[SkippedSong] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            skipped.append(SkippedSong(f"row-{index}", "bad-row", str(exc)))
            continue
        if not isinstance(row, dict):
            skipped.append(SkippedSong(f"row-{index}", "bad-row", "not a JSON object"))
            continue
        parsed = parse_song(row, index)
        (skipped if isinstance(parsed, SkippedSong) else songs).append(parsed)  # type: ignore[arg-type]
    return songs, skipped


def load_lm_codes(storage: Any, key: str) -> tuple[list[LmSong], list[SkippedSong]]:
    """`read_lm_codes` of a `Storage` key."""
    return read_lm_codes(storage.read_text(key).splitlines())


_ROW_FIELDS = (
    ("id", "song_id"),
    ("caption", "caption"),
    ("lyrics", "lyrics"),
    ("bpm", "bpm"),
    ("keyscale", "keyscale"),
    ("timesignature", "timesignature"),
    ("language", "language"),
    ("duration", "duration"),
    ("instrumental", "instrumental"),
    ("custom_tag", "custom_tag"),
    ("tag_position", "tag_position"),
    ("genre", "genre"),
    ("repeat", "repeat"),
)


def song_row(song: LmSong) -> dict[str, Any]:
    """The JSONL row of a song (the reader's first column names)."""
    row = {COLUMNS[name][0]: getattr(song, attr) for name, attr in _ROW_FIELDS}
    row["codes"] = list(song.codes)
    return {k: v for k, v in row.items() if v not in (None, "")}


def write_lm_codes(path: str | Path, songs: Sequence[LmSong]) -> Path:
    """Write songs as `lm_codes.jsonl` (tests and dry runs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(song_row(s), ensure_ascii=False) + "\n" for s in songs)
    path.write_text(text, encoding="utf-8")
    return path


# -- the extract stage: lm_codes.jsonl from the tensor cache -------------------------------------
META_FILE = layout.PREPROCESS_META_FILE
# Row fields that say which file (and which tokenizer) the codes came from (HOT-Step's reuse rule):
# a row is reused iff all four still match the sample's tensor file.
STAMP_FIELDS = ("_id", "_st_bytes", "_st_mtime_ms", "_tok")


@dataclass
class ExtractResult:
    key: str  # the lm_codes.jsonl written or kept
    source: Literal["cache", "codes"]  # rebuilt from the tensor files | used as it was
    written: int = 0  # rows (re)read from their tensor file
    reused: int = 0  # rows kept because their stamps still match
    failed: list[str] = field(default_factory=list)  # "sample: reason"
    changed: bool = False  # the file was rewritten


def _stamps(storage: Any, key: str, sample_id: str, tokenizer_id: str) -> dict[str, Any]:
    return {
        "_id": sample_id,
        "_st_bytes": storage.size(key),
        "_st_mtime_ms": storage.mtime_ns(key) // 1_000_000,
        "_tok": tokenizer_id,
    }


def extract_codes(
    storage: Any, tensors_dir: str, *, overwrite: bool = False, log: Any = None
) -> ExtractResult:
    """The `extract` stage: `<tensors_dir>/lm_codes.jsonl`, one row per good sample of
    `preprocess_meta.json` in its order, from each sample's tensor file (`audio_codes`, the 5 Hz
    FSQ codes preprocessing stored, and the LM prompt fields in its header). A row already in the
    file is reused iff its `STAMP_FIELDS` match the file now (`_tok` = the preprocess model
    fingerprint, i.e. which tokenizer made the codes); `overwrite` re-reads every file. Without
    a `preprocess_meta.json` an existing lm_codes.jsonl is used as it is. `log(message, level)`
    hears about failures and the totals."""
    from hotstep_ray.preprocess.cache import CODE_LINE_FIELDS, read_sample

    key = f"{tensors_dir}/{CODES_FILE}"
    say = log or (lambda message, level="info": None)
    if not storage.exists(f"{tensors_dir}/{META_FILE}"):
        if storage.exists(key):
            say(f"extract: no {META_FILE} in {storage.url_of(tensors_dir)}; using {CODES_FILE}")
            return ExtractResult(key, "codes")
        raise InputError(
            f"{storage.url_of(tensors_dir)}: neither {META_FILE} nor {CODES_FILE} (run preprocess)"
        )
    meta = storage.read_json(f"{tensors_dir}/{META_FILE}")
    tokenizer_id = str(meta.get("model_fingerprint") or meta.get("model_variant") or "")
    old: dict[str, dict[str, Any]] = {}
    if storage.exists(key) and not overwrite:
        for line in storage.read_text(key).splitlines():
            with contextlib.suppress(ValueError, TypeError):
                row = json.loads(line)
                if isinstance(row, dict) and "_id" in row:  # preprocess's rows carry no _id
                    old[str(row["_id"])] = row
    result = ExtractResult(key, "cache")
    lines = []
    for entry in meta.get("samples") or []:
        if not entry.get("ok") or not entry.get("file"):
            continue
        sample_id, file_key = str(entry["sample_id"]), f"{tensors_dir}/{entry['file']}"
        if not storage.exists(file_key):
            result.failed.append(f"{sample_id}: {entry['file']} missing")
            continue
        stamps = _stamps(storage, file_key, sample_id, tokenizer_id)
        previous = old.get(sample_id)
        if previous is not None and all(previous.get(k) == stamps[k] for k in STAMP_FIELDS):
            lines.append(json.dumps(previous, ensure_ascii=False))
            result.reused += 1
            continue
        try:
            tensors, header = read_sample(storage, file_key)
            codes = tensors["audio_codes"].reshape(-1).tolist()
        except Exception as exc:  # a damaged file is reported, the others still extract
            result.failed.append(f"{sample_id}: {type(exc).__name__}: {exc}")
            continue
        row = {"sample_id": sample_id, "file": entry["file"], "codes": codes}
        row.update({name: header.get(name) for name in CODE_LINE_FIELDS})
        lines.append(json.dumps({**row, **stamps}, ensure_ascii=False))
        result.written += 1
    for failure in result.failed:
        say(f"extract: skipped {failure}", "warn")
    if not lines:
        raise InputError(f"{storage.url_of(tensors_dir)}: no sample gave codes to extract")
    text = "".join(f"{line}\n" for line in lines)
    if not storage.exists(key) or storage.read_text(key) != text:
        storage.write_text(key, text)
        result.changed = True
    say(
        f"extract: {len(lines)} songs in {storage.url_of(key)} "
        f"({result.written} read from tensor files, {result.reused} reused)"
    )
    return result


def synthetic_songs(count: int, codes_per_song: int | Sequence[int], seed: int = 0) -> list[LmSong]:
    """Deterministic made-up songs (random codes, varied metas) for tests and benchmarks."""
    rng = random.Random(seed)
    lengths = [codes_per_song] * count if isinstance(codes_per_song, int) else list(codes_per_song)
    keys = ("C major", "A minor", "E minor", "G major")
    songs = []
    for i, n in enumerate(lengths):
        songs.append(
            LmSong(
                song_id=f"song-{i:03d}",
                caption=f"{rng.choice(('calm', 'bright', 'dark'))} piano ballad {i}",
                lyrics="[Instrumental]" if i % 2 else f"[Verse]\nline {i} of the song\n",
                codes=tuple(rng.randrange(lm_tokenizer.NUM_VALID_AUDIO_CODES) for _ in range(n)),
                bpm=rng.randrange(60, 180),
                keyscale=keys[i % len(keys)],
                timesignature="4",
                language="en" if i % 2 == 0 else "",
                duration=None,
                instrumental=bool(i % 2),
            )
        )
    return songs


# -- rendering -----------------------------------------------------------------------------------
def _has_tag(caption: str, tag: str, position: str) -> bool:
    if position == "replace":
        return caption == tag
    if position == "append":
        return caption == tag or caption.endswith(f", {tag}")
    return caption == tag or caption.startswith(f"{tag}, ")


def song_caption(song: LmSong, trigger: str = "", position: str = "prepend") -> str:
    """The caption (the genre when it is empty) with the trigger baked in as the DiT path does
    (`apply_custom_tag`); a per-song tag wins over the run's. Idempotent: a caption that already
    carries the tag is kept as is."""
    caption = song.caption or song.genre
    tag = song.custom_tag or trigger
    position = song.tag_position or position
    if song.trigger_applied or not tag or _has_tag(caption, tag, position):
        return caption
    return prompts.apply_custom_tag(caption, tag, position)


def cot_metadata(song: LmSong, caption: str, with_caption: bool = True) -> dict[str, Any]:
    """The CoT fields (`prompts.cot_yaml` sorts and formats them): bpm, caption, duration (int
    seconds, from the row or len(codes)/5), keyscale, language, timesignature; empty ones dropped.
    HOT-Step writes caption and language whenever present; `with_caption=False` leaves the
    caption out (upstream's CoT when the user gave all four metas)."""
    if song.duration:
        seconds = int(song.duration)  # as upstream writes it: truncated
    else:
        seconds = max(1, round(len(song.codes) / CODE_HZ))
    meta: dict[str, Any] = {
        "bpm": song.bpm,
        "caption": caption if with_caption and caption else None,
        "duration": seconds,
        "keyscale": song.keyscale or None,
        "language": song.language or None,
        "timesignature": song.timesignature or None,
    }
    return {k: v for k, v in meta.items() if v is not None}


@dataclass(frozen=True)
class LmExample:
    """A tokenized song. Targets are the tokens at positions [loss_start, loss_end)."""

    song_id: str
    input_ids: tuple[int, ...]
    loss_start: int  # `<think>` (loss_on_cot) or the first code
    loss_end: int  # one past the closing <|im_end|>
    n_codes: int

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return self.loss_end - self.loss_start


@dataclass(frozen=True)
class RenderOptions:
    trigger: str = ""
    trigger_position: str = "prepend"
    loss_on_cot: bool = True
    cot_caption: bool = True
    final_newline: bool = True  # keep the template's "\n" after <|im_end|> (never a target)


def render_example(
    tokenizer: PreTrainedTokenizerBase, song: LmSong, options: RenderOptions = RenderOptions()
) -> LmExample:
    """One song through the chat template in the trained layout, with its loss span."""
    caption = song_caption(song, options.trigger, options.trigger_position)
    lyrics = prompts.normalize_lyrics(song.lyrics, song.instrumental)
    cot = prompts.format_cot(cot_metadata(song, caption, options.cot_caption))
    seq = lm_tokenizer.render_training_sequence(
        tokenizer, caption, lyrics, cot, song.codes, final_newline=options.final_newline
    )
    start = seq.cot_start if options.loss_on_cot else seq.codes_start
    return LmExample(song.song_id, tuple(seq.input_ids), start, seq.codes_end + 1, len(song.codes))


def build_examples(
    tokenizer: PreTrainedTokenizerBase,
    songs: Sequence[LmSong],
    max_len: int,
    options: RenderOptions = RenderOptions(),
) -> tuple[list[LmExample], list[SkippedSong]]:
    """Render every song (`repeat` copies of it); those longer than `max_len` tokens (0 = no cap)
    are skipped and reported, never truncated."""
    examples: list[LmExample] = []
    skipped: list[SkippedSong] = []
    for song in songs:
        example = render_example(tokenizer, song, options)
        if max_len and example.length > max_len:
            detail = f"{example.length} tokens > max_len {max_len}"
            skipped.append(SkippedSong(song.song_id, "too-long", detail, example.length))
        else:
            examples.extend([example] * song.repeat)
    return examples, skipped


# -- grouping into micro-batches -----------------------------------------------------------------
Row = tuple[int, ...]  # example indices packed into one token row
Group = tuple[Row, ...]  # the rows of one micro-batch


def plan_groups(
    lengths: Sequence[int], batching: Batching, batch: int = 1, pack_tokens: int = 0
) -> list[Group]:
    """Fixed micro-batch groups (example indices) for the whole run.

    single: one song per micro-batch, in index order.
    bucket: songs sorted by length, `batch` per micro-batch (one per row, padded to the longest).
    pack:   first-fit-decreasing into rows of at most `pack_tokens` tokens, one row per micro-batch.
    """
    order = list(range(len(lengths)))
    if batching == "single":
        return [((i,),) for i in order]
    if batching == "bucket":
        order.sort(key=lambda i: (lengths[i], i))
        return [tuple((i,) for i in order[s : s + batch]) for s in range(0, len(order), batch)]
    if batching != "pack":
        raise ValueError(f"batching must be single, bucket or pack, got {batching!r}")
    capacity = pack_tokens or max(lengths, default=0)
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a song of {max(lengths)} tokens does not fit pack_tokens={capacity}")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(order, key=lambda i: (-lengths[i], i)):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return [(tuple(row),) for row in rows]


def epoch_groups(
    groups: Sequence[Group], epoch: int, seed: int, order: str = "shuffle"
) -> list[Group]:
    """Group order of one epoch (1-based): a permutation seeded by (seed, epoch), so a resumed run
    sees the same order as an uninterrupted one; `sequential` keeps the planned order."""
    out = list(groups)
    if order == "shuffle":
        random.Random(seed * 1_000_003 + epoch).shuffle(out)
    return out


def shard_groups(groups: Sequence[Group], rank: int, world: int) -> list[Group]:
    """Rank `rank`'s share of an epoch: every `world`-th group, padded by wrap-around so each
    rank takes the same number of steps (as DistributedSampler does)."""
    if world <= 1:
        return list(groups)
    per_rank = math.ceil(len(groups) / world)
    padded = [groups[i % len(groups)] for i in range(per_rank * world)]
    return padded[rank::world]


DEFAULT_PACK_TOKENS = 8192  # row capacity when packing (about four 240 s songs)


@dataclass
class DataPlan:
    """The rendered songs (`repeat` copies each), what was skipped, and the run's groups."""

    examples: list[LmExample]
    skipped: list[SkippedSong]
    groups: list[Group]
    max_len: int
    step_tokens: int  # largest micro-batch, rows x width
    step_targets: int  # most targets in one micro-batch
    trigger: str = ""  # the run's trigger (for the adapter's metadata)
    trigger_position: str = "prepend"
    max_len_source: str = ""  # user | auto (fits the GPU) | cap
    held_out: list[LmExample] = field(default_factory=list)  # holdout songs, one example each
    holdout: dict[str, Any] | None = None  # the split, when songs are held out


def common_trigger(songs: Sequence[LmSong], render: RenderOptions) -> tuple[str, str]:
    """The trigger the adapter answers to: the run's, else the tag every song carries (the
    preprocess stage writes each row's effective `custom_tag` / `tag_position`)."""
    if render.trigger:
        return render.trigger, render.trigger_position
    tags = {(s.custom_tag, s.tag_position or render.trigger_position) for s in songs}
    if len(tags) == 1:
        tag, position = tags.pop()
        if tag:
            return tag, position
    return "", render.trigger_position


def plan_data(
    tokenizer: PreTrainedTokenizerBase,
    songs: Sequence[LmSong],
    bad: Sequence[SkippedSong],
    render: RenderOptions,
    *,
    max_len: int,
    batching: Batching = "single",
    batch: int = 1,
    pack_tokens: int = 0,
    pad_multiple: int = 1,
) -> DataPlan:
    """Render, skip over-length songs, plan the groups, size the largest micro-batch. A run
    trigger (`render.trigger`) replaces the tags the rows carry; without one each row's tag is
    baked into its own caption."""
    if render.trigger:
        songs = [replace(s, custom_tag="", tag_position="") for s in songs]
    examples, too_long = build_examples(tokenizer, songs, max_len, render)
    skipped = [*bad, *too_long]
    trigger, position = common_trigger(songs, render)
    if not examples:
        return DataPlan([], skipped, [], max_len, 0, 0, trigger, position)
    lengths = [e.length for e in examples]
    pack_tokens = pack_tokens or max(max(lengths), min(DEFAULT_PACK_TOKENS, max_len or 1 << 30))
    groups = plan_groups(lengths, batching, batch, pack_tokens)
    step_tokens = largest_step(examples, groups, pad_multiple)
    step_targets = max(sum(examples[i].n_targets for row in g for i in row) for g in groups)
    return DataPlan(
        examples, skipped, groups, max_len, step_tokens, step_targets, trigger, position
    )


# -- collation -----------------------------------------------------------------------------------
@dataclass
class MicroBatch:
    """Model inputs of one micro-batch of R rows x T tokens, M targets, D songs.

    input_ids, position_ids [R, T] long (positions restart at 0 per song; pads continue the song
    before them). pred_index [M] long: flat index (into R·T) of the position whose output predicts
    each target, i.e. one before the target token; target_ids [M] long; target_weight [M] float32 =
    1 / (targets of its song), so Σ weight·CE is the sum of per-song mean losses. cu_seqlens [D+1]
    int32: song starts in the flattened R·T tokens plus the end (pads belong to the song before
    them); max_seqlen: the longest such segment."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    pred_index: torch.Tensor
    target_ids: torch.Tensor
    target_weight: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    song_ids: list[str] = field(default_factory=list)
    doc_lengths: list[int] = field(default_factory=list)  # real tokens per song

    @property
    def n_songs(self) -> int:
        return len(self.song_ids)

    @property
    def n_tokens(self) -> int:
        return sum(self.doc_lengths)

    @property
    def n_targets(self) -> int:
        return int(self.pred_index.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        tensors = (
            self.input_ids,
            self.position_ids,
            self.pred_index,
            self.target_ids,
            self.target_weight,
            self.cu_seqlens,
        )
        moved = [t.to(device=device, non_blocking=True) for t in tensors]
        return MicroBatch(*moved, self.max_seqlen, self.song_ids, self.doc_lengths)


def row_width(examples: Sequence[LmExample], group: Group, pad_multiple: int = 1) -> int:
    """T of a group's `[R, T]` micro-batch: its longest row in tokens, rounded up to
    `pad_multiple` (a compiled layer has one graph per distinct [R, T])."""
    longest = max(sum(examples[i].length for i in row) for row in group)
    return math.ceil(longest / pad_multiple) * pad_multiple


def largest_step(examples: Sequence[LmExample], groups: Sequence[Group], pad_multiple: int) -> int:
    """Tokens of the largest `[R, T]` micro-batch (R x T, padding included): what the memory
    plan sizes."""
    return max(len(g) * row_width(examples, g, pad_multiple) for g in groups)


# What one more compiled row width costs, in training tokens: the 4B's compile time for a new
# width times its compiled + graphs throughput (arithmetic from docs/BENCHMARKS.md: row
# `lm-4b-song`'s tokens/s and the LM table's note on compiling). Smaller LMs train more tokens
# per second for a similar compile, so this undercharges them: it errs towards more widths, the
# choice that wastes no compute.
COMPILE_COST_TOKENS = 250_000
PAD_MULTIPLES = (64, 128, 256, 512)  # candidate row-width multiples when the layers compile


def compiled_shapes(
    examples: Sequence[LmExample], groups: Sequence[Group], pad_multiple: int
) -> set[tuple[int, int]]:
    """The distinct `[R, T]` micro-batch shapes of `groups`: one compile (and graph) each."""
    return {group_shape(examples, g, pad_multiple) for g in groups}


def group_shape(examples: Sequence[LmExample], group: Group, pad_multiple: int) -> tuple[int, int]:
    """`[R, T]` of the micro-batch `group` collates to: its rows and their padded width."""
    return len(group), row_width(examples, group, pad_multiple)


# An eager step costs about this many compiled ones at the same shape: the 4B's eager and
# compiled + graphs steps on one song (docs/BENCHMARKS.md, rows `lm-4b-modes` and `lm-4b-song`).
EAGER_SLOWDOWN = 3.0


def compile_pays(
    examples: Sequence[LmExample],
    groups: Sequence[Group],
    epochs: int,
    pad_multiple: int,
    compile_cost_tokens: int = COMPILE_COST_TOKENS,
    slowdown: float = EAGER_SLOWDOWN,
) -> bool:
    """Whether compiling the layers shortens the run, in compiled-token time: eagerly its
    `epochs` epochs of tokens cost `slowdown` times as much, compiled they cost one each plus
    one compile per micro-batch shape. A first try of a few songs and epochs runs sooner eager."""
    shapes = len(compiled_shapes(examples, groups, pad_multiple))
    tokens = epochs * sum(len(g) * row_width(examples, g, pad_multiple) for g in groups)
    return (slowdown - 1.0) * tokens > shapes * compile_cost_tokens


def pick_pad_multiple(
    examples: Sequence[LmExample],
    groups: Sequence[Group],
    epochs: int,
    candidates: Sequence[int] = PAD_MULTIPLES,
    compile_cost_tokens: int = COMPILE_COST_TOKENS,
) -> int:
    """The row-width multiple of a compiled run: the one that minimises compile time plus the
    padded tokens of `epochs` epochs, both in tokens. Coarser multiples mean fewer widths to
    compile but more padding in every step: a short run of songs of assorted lengths takes
    256 (a few compiles), a long run keeps 64. Ties go to the smaller multiple."""

    def cost(multiple: int) -> int:
        shapes = len(compiled_shapes(examples, groups, multiple))
        tokens = sum(len(g) * row_width(examples, g, multiple) for g in groups)
        return shapes * compile_cost_tokens + epochs * tokens

    return min(sorted(candidates), key=cost)


def collate(
    examples: Sequence[LmExample],
    group: Group,
    pad_id: int = lm_tokenizer.PAD_ID,
    pad_multiple: int = 1,
) -> MicroBatch:
    """Rows of whole songs -> padded `[R, T]` tensors (T = longest row, rounded up to
    `pad_multiple`), position ids restarting per song, targets weighted per song."""
    width = row_width(examples, group, pad_multiple)
    input_ids = torch.full((len(group), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(group), width), dtype=torch.long)
    targets: list[torch.Tensor] = []  # flat target positions
    weights: list[torch.Tensor] = []
    starts: list[int] = []
    song_ids: list[str] = []
    doc_lengths: list[int] = []
    for r, row in enumerate(group):
        offset = 0
        for n, i in enumerate(row):
            ex = examples[i]
            # The last song of a row also owns the row's padding: its positions run on.
            span = width - offset if n == len(row) - 1 else ex.length
            input_ids[r, offset : offset + ex.length] = torch.tensor(ex.input_ids)
            position_ids[r, offset : offset + span] = torch.arange(span)
            first = r * width + offset
            targets.append(torch.arange(first + ex.loss_start, first + ex.loss_end))
            weights.append(torch.full((ex.n_targets,), 1.0 / ex.n_targets))
            starts.append(first)
            song_ids.append(ex.song_id)
            doc_lengths.append(ex.length)
            offset += ex.length
    target_pos = torch.cat(targets)
    bounds = [*starts, len(group) * width]
    max_seqlen = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        pred_index=target_pos - 1,  # loss_start >= 1: never crosses into the previous song
        target_ids=input_ids.flatten()[target_pos],
        target_weight=torch.cat(weights),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        max_seqlen=max_seqlen,
        song_ids=song_ids,
        doc_lengths=doc_lengths,
    )


def padding_stats(examples: Sequence[LmExample], groups: Sequence[Group], pad_multiple: int = 1):
    """(real tokens, padded tokens) over one epoch of `groups`."""
    real = padded = 0
    for group in groups:
        rows = [sum(examples[i].length for i in row) for row in group]
        width = row_width(examples, group, pad_multiple)
        real += sum(rows)
        padded += width * len(rows) - sum(rows)
    return real, padded


# -- constrained decoding of the trained layout --------------------------------------------------
class CodesOnlyLogitsProcessor(LogitsProcessor):
    """After the phase-2 prompt (which ends `</think>\\n\\n`) allow only audio codes 0..63999 and
    `<|im_end|>`; EOS is blocked until `min_codes` codes and forced at `max_codes` (upstream's
    constrained decoding after `</think>`). `prompt_length` is the prompt's token count."""

    def __init__(self, prompt_length: int, min_codes: int = 0, max_codes: int | None = None):
        self.prompt_length = prompt_length
        self.min_codes = min_codes
        self.max_codes = max_codes
        self._first = lm_tokenizer.AUDIO_CODE_BASE_ID
        self._last = lm_tokenizer.AUDIO_CODE_BASE_ID + lm_tokenizer.NUM_VALID_AUDIO_CODES

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        emitted = input_ids.shape[1] - self.prompt_length
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        if self.max_codes is None or emitted < self.max_codes:
            allowed[self._first : self._last] = True
        if emitted >= self.min_codes:
            allowed[lm_tokenizer.IM_END_ID] = True
        return scores.masked_fill(~allowed, float("-inf"))
