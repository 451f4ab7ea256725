"""Data of the MM3 composer-LM LoRA (`lm_train.py`): prompt ids + RVQ codes per song, crops, and
the teacher-forced inputs and targets.

Per song (a dataset sample):
- caption: the MM3 structured caption `<stem>.mm3.txt` next to the audio (`condition.read_caption`;
  a missing or blank one is an `Mm3CaptionError`, never the ACE caption);
- lyrics: the sample's lyrics, "[instrumental]" when empty (`condition.song_lyrics`);
- prompt: the reference template and cleaners (diffusers `MiniMaxMusic3TokenizeStep`, conditional
  row only) -> ids [P], ending in `<|audio_start|>`;
- codes: `<codes dir>/<file stem>.codes` (or `.npy`), read by `aligned.read_codes`: int32 [n, 8],
  columns semantic, acoustic 1..7, row 0 the un-emitted WARM-UP row (seed trap 4). The warm-up row
  is DROPPED here, leaving frames [F, 8] = rows 1 .. n-1 (HOT-Step `mm3-lm-train`; SimpleTuner
  also supervises frame 0 at P - 1). Semantic codes must lie in [0, 16384), acoustic codes in
  [0, V) (V = the depth decoder's `audio_vocab_size`, 1024 in the release).

Teacher-forced sequence of a crop of frames f_a .. f_{a+n-1} (mm3.md §1.5, §3.7):

    inputs  = embed(prompt) [P] ++ frame_embed(f_a .. f_{a+n-2}) [n - 1]      (+ f_{a+n-1} if EOS)
    targets = semantic(f_a .. f_{a+n-1}) at positions P-1 .. P+n-2            (+ EOS at P+n-1)

frame_embed(c) = (LM.embed(c_0 + 151675) + sum_{k=1..7} depth.audio_embeddings(c_k + (k-1) V))
                 * 8^-0.5
(the reference's `_embed_audio_frame`, used as is: the semantic code embeds through the LM table,
seed trap 5). EOS (`<|audio_end|>`, id 151670) is a target only when the crop reaches the song's
last frame. A crop of `max_frames` frames starts at frame 0 (`beginning`) or at a seeded uniform
frame (`random`; the prompt is then followed by mid-song frames, as in HOT-Step's random crops).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from diffusers.modular_pipelines.minimax_music3.encoders import (
    MiniMaxMusic3TokenizeStep,
    _embed_audio_frame,
)
from diffusers.modular_pipelines.modular_pipeline import PipelineState

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import stem_key
from hotstep_ray.dataset.store import included_samples, load_dataset
from hotstep_ray.mm3.aligned import CODEBOOKS, SEMANTIC_OFFSET, read_codes
from hotstep_ray.mm3.condition import Mm3CaptionError, read_caption, song_lyrics
from hotstep_ray.mm3.options import CropMode

AUDIO_END_ID = 151_670  # <|audio_end|>: the composer's EOS
SEMANTIC_VOCAB = 16_384
# Head rows the loss reads: one contiguous slice [151670, 151675 + 16384) (a view of the frozen
# head, no copy). Its rows 1..4 are the caption/lyrics delimiters 151671-151674, which the
# reference masks at sampling time, so they are masked here too: the softmax runs over exactly the
# reference's allowed set, EOS + 16,384 semantic codes.
HEAD_START = AUDIO_END_ID
HEAD_END = SEMANTIC_OFFSET + SEMANTIC_VOCAB
HEAD_MASKED = tuple(range(1, SEMANTIC_OFFSET - AUDIO_END_ID))  # local rows 1..4
EOS_CLASS = 0  # local index of <|audio_end|> in the slice
SEMANTIC_BASE = SEMANTIC_OFFSET - HEAD_START  # local index of semantic code 0 (= 5)


@dataclass(frozen=True, eq=False)
class LmSong:
    stem: str  # codes file stem
    sample_id: str
    prompt_ids: torch.Tensor  # [P] int64, ends with <|audio_start|>
    frames: torch.Tensor  # [F, 8] int64, warm-up row dropped

    @property
    def n_frames(self) -> int:
        return int(self.frames.shape[0])


def prompt_ids(tokenizer, caption: str, lyrics: str) -> torch.Tensor:
    """[P] prompt ids of the reference template (conditional row of the reference block)."""
    state = PipelineState()
    state.set("prompt", caption)
    state.set("lyrics", lyrics)
    components = SimpleNamespace(tokenizer=tokenizer, _execution_device=torch.device("cpu"))
    try:
        MiniMaxMusic3TokenizeStep()(components, state)
    except ValueError as exc:  # empty caption/lyrics, prompt over 5,000 tokens
        raise InputError(f"MM3 prompt: {exc}") from exc
    return state.get("text_ids")[0].long()


def check_codes(codes: torch.Tensor, acoustic_vocab: int, where: str) -> None:
    """Refuse codes the model cannot embed (a wrong file shape often shows up here)."""
    if codes.ndim != 2 or codes.shape[1] != CODEBOOKS:
        raise InputError(f"{where}: codes must be [frames, {CODEBOOKS}], got {tuple(codes.shape)}")
    if codes.shape[0] < 1:
        raise InputError(f"{where}: no audio frame after the warm-up row")
    semantic, acoustic = codes[:, 0], codes[:, 1:]
    if int(semantic.min()) < 0 or int(semantic.max()) >= SEMANTIC_VOCAB:
        raise InputError(
            f"{where}: semantic codes must lie in [0, {SEMANTIC_VOCAB}), got "
            f"[{int(semantic.min())}, {int(semantic.max())}]"
        )
    if int(acoustic.min()) < 0 or int(acoustic.max()) >= acoustic_vocab:
        raise InputError(
            f"{where}: acoustic codes must lie in [0, {acoustic_vocab}), got "
            f"[{int(acoustic.min())}, {int(acoustic.max())}] (wrong file layout?)"
        )


def codes_key(folder: Storage, rel_path: str) -> str | None:
    """`<file stem>.codes` or `.npy` in `folder` (the `mm3 preprocess --codes-dir` naming)."""
    base = stem_key(rel_path).rsplit("/", 1)[-1]
    for suffix in (".codes", ".npy"):
        if folder.exists(base + suffix):
            return base + suffix
    return None


def load_lm_songs(
    storage: Storage,
    slug: str,
    codes_dir: str,
    tokenizer,
    acoustic_vocab: int,
    warmup_row: bool = True,
    sample_ids: list[str] | None = None,
) -> list[LmSong]:
    """Every included sample of dataset `slug` (or `sample_ids`) with its codes and caption.
    A sample without a codes file, or with codes but no MM3 caption, is an error listing every
    such sample: nothing is dropped silently."""
    detail = load_dataset(storage, slug)
    source = Storage(detail.source_dir)
    folder = Storage(codes_dir)
    wanted = set(sample_ids) if sample_ids else None
    songs, missing_codes, missing_caption = [], [], []
    for sample in included_samples(detail.samples):
        if wanted is not None and sample.sample_id not in wanted:
            continue
        key = codes_key(folder, sample.rel_path)
        if key is None:
            missing_codes.append(sample.rel_path)
            continue
        try:
            caption = read_caption(source, sample.rel_path)
        except Mm3CaptionError as exc:
            missing_caption.append(str(exc))
            continue
        lyrics = song_lyrics(sample.lyrics, sample.is_instrumental)
        frames = read_codes(folder, key, warmup_row=warmup_row)[1:]  # drop the warm-up row
        check_codes(frames, acoustic_vocab, folder.url_of(key))
        ids = prompt_ids(tokenizer, caption, lyrics)
        songs.append(LmSong(key.rsplit(".", 1)[0], sample.sample_id, ids, frames))
    if missing_caption:
        raise Mm3CaptionError("; ".join(missing_caption))
    if missing_codes:
        raise InputError(
            f"no <stem>.codes (or .npy) in {folder.url} for: {', '.join(missing_codes)} "
            "(pass --sample-id to train on a subset)"
        )
    if not songs:
        raise InputError(f"dataset {slug!r} has no sample to train the MM3 composer on")
    return songs


# -- crops and the teacher-forced sequence -------------------------------------------------------
def draw_crop(
    song: LmSong, max_frames: int, gen: torch.Generator, mode: CropMode = "random"
) -> tuple[int, int]:
    """(first frame, frame count) of a crop; the whole song when it fits. One draw is always
    consumed so both modes see the same random stream."""
    total = song.n_frames
    count = total if max_frames <= 0 else min(total, max_frames)
    first = int(torch.randint(total - count + 1, (1,), generator=gen))
    return (0 if mode == "beginning" else first), count


def embed_frames(lm, depth, frames: torch.Tensor) -> torch.Tensor:
    """[N, 8] codes -> [N, H] feedback embeddings, by the reference `_embed_audio_frame`."""
    if frames.shape[0] == 0:  # a one-frame crop without EOS feeds nothing back
        weight = lm.get_input_embeddings().weight
        return weight.new_zeros(0, weight.shape[1])
    return _embed_audio_frame(lm, depth, frames)[:, 0]


def sequence(
    lm, depth, song: LmSong, first: int, count: int, supervise_eos: bool = True
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(inputs_embeds [1, T, H], targets [M] local head classes, P) of one crop; the targets
    belong to positions P - 1 .. P - 2 + M of the sequence."""
    frames = song.frames[first : first + count]
    eos = supervise_eos and first + count == song.n_frames
    device = lm.get_input_embeddings().weight.device
    frames = frames.to(device)
    fed = frames if eos else frames[:-1]  # the last frame is fed back only to predict EOS
    prompt = lm.get_input_embeddings()(song.prompt_ids.to(device))  # [P, H]
    embeds = torch.cat([prompt, embed_frames(lm, depth, fed).to(prompt.dtype)])[None]
    targets = frames[:, 0] + SEMANTIC_BASE
    if eos:
        targets = torch.cat([targets, targets.new_tensor([EOS_CLASS])])
    return embeds, targets, int(song.prompt_ids.shape[0])
