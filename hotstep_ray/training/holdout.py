"""Held-out songs and the per-epoch held-out loss, as `eval` metric events during training.

Split. `split_holdout(ids, fraction, seed)` keeps k = clamp(round(fraction · n), 1, n - 1) songs
out of training, chosen by sha1(f"{seed}:{id}") order (independent of file order, stable when
songs are added). It refuses n < 6 songs (`MIN_SONGS`, the seed's rule): with fewer, one held-out
song is a noisy estimate and costs a large share of the data. `partition_songs` (LM, by
`LmSong.song_id`) and `partition_cache` (DiT, by tensor-file stem) apply a split.

The hook, for any trainer:

    evaluator = HoldoutEval(song_losses, songs=len(held), events=events if main_rank else None)
    ... after the optimizer steps of every epoch (before or after the epoch event):
    loss = evaluator(epoch: int, model: nn.Module) -> float | None

  - `song_losses(model) -> Sequence[float]`: one loss per held-out song, in the trainer's units.
    It runs under `torch.no_grad()` with `model.eval()`; the model's training mode is restored.
  - Emits `MetricEvent(metric="eval", epoch, loss, split="holdout", songs, best)`: `loss` is the
    mean over held-out songs (the trainers' epoch loss is a mean over songs too), `best` marks a
    new minimum. Returns the loss, or None on epochs skipped by `every`.
  - `evaluator.history` = [{epoch, loss}] for the train log (suggested key: `holdout`).
Where it is wired: the LM trainer (`lm_setup.plan_data` splits `lm_codes.jsonl` songs,
`lm.train_lm` calls the evaluator after each epoch, `lm_train_log.json` key `holdout`) and
`dit.py` (`setup` splits the tensor cache with `split_cache`, `end_epoch` calls `dit_epoch_end`,
`dit_train_log.json` key `holdout`). Both keep [{epoch, loss}] in their resumable state.
Ready-made `song_losses`:
  - LM: `lm_song_losses(held_examples)`: each held-out song's mean CE over its loss span through
    the trainer's `LmLossModule` (bf16 autocast on CUDA), i.e. `lm_loss.batch_loss` of a one-song
    batch. `lm_epoch_hook(evaluator)` fits `train_lm(on_epoch=...)`: (setup, state) -> None.
  - DiT: `dit_song_losses(run, held_cache)`: per held-out song, the first min(crop, T) frames at
    `draws` timesteps with noise, all from a generator seeded by (seed, "holdout", song), so every
    epoch sees the same draws; no CFG drop; `raw_loss` (plain masked MSE of v = noise - x0).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.training import dit_data, dit_loss, lm_loss, lm_vram
from hotstep_ray.training.dit_data import TensorCache
from hotstep_ray.training.lm_data import LmExample, LmSong, collate

MIN_SONGS = 6
DEFAULT_FRACTION = 0.1
SongLosses = Callable[[nn.Module], Sequence[float]]


@dataclass(frozen=True)
class HoldoutSplit:
    train: tuple[str, ...]
    held_out: tuple[str, ...]
    fraction: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "train": list(self.train),
            "held_out": list(self.held_out),
            "fraction": self.fraction,
            "seed": self.seed,
        }


def split_holdout(
    song_ids: Sequence[str], fraction: float = DEFAULT_FRACTION, seed: int = 42
) -> HoldoutSplit:
    """Hold out a fraction of the songs (see the module docstring)."""
    ids = sorted(set(song_ids))
    if len(ids) != len(song_ids):
        raise InputError("song ids must be unique to hold some out")
    if len(ids) < MIN_SONGS:
        raise InputError(
            f"holdout needs at least {MIN_SONGS} songs, the dataset has {len(ids)}; "
            "train without holdout"
        )
    if not 0.0 < fraction < 1.0:
        raise InputError(f"holdout fraction {fraction:g}: must be between 0 and 1")
    count = min(max(1, round(fraction * len(ids))), len(ids) - 1)
    order = sorted(ids, key=lambda s: hashlib.sha1(f"{seed}:{s}".encode()).hexdigest())
    held = set(order[:count])
    return HoldoutSplit(
        train=tuple(s for s in ids if s not in held),
        held_out=tuple(s for s in ids if s in held),
        fraction=fraction,
        seed=seed,
    )


def partition_songs(songs: Sequence[LmSong], split: HoldoutSplit) -> tuple[list, list]:
    """(training songs, held-out songs) of `lm_codes.jsonl` rows, by song id."""
    held = set(split.held_out)
    return [s for s in songs if s.song_id not in held], [s for s in songs if s.song_id in held]


def partition_cache(cache: TensorCache, split: HoldoutSplit) -> tuple[TensorCache, TensorCache]:
    """(training cache, held-out cache) of a DiT tensor cache, by file stem. Channel statistics
    stay those of the whole cache (they normalise the loss, they are not learned)."""
    held = set(split.held_out)
    train = [s for s in cache.songs if s.stem not in held]
    out = [s for s in cache.songs if s.stem in held]
    if not train or not out:
        raise InputError("the split leaves no training or no held-out song in the tensor cache")
    return replace(cache, songs=train), replace(cache, songs=out)


class HoldoutEval:
    """The per-epoch hook (see the module docstring)."""

    def __init__(
        self,
        song_losses: SongLosses,
        *,
        songs: int,
        events: EventLog | None = None,
        every: int = 1,
        split: str = "holdout",
        info: dict[str, Any] | None = None,
    ) -> None:
        if every < 1:
            raise InputError("every must be >= 1")
        self.song_losses, self.songs, self.events = song_losses, songs, events
        self.every, self.split = every, split
        self.info = info  # the split's description for the train log (HoldoutSplit.to_dict)
        self.history: list[dict[str, Any]] = []
        self.best = math.inf

    def __call__(self, epoch: int, model: nn.Module) -> float | None:
        if epoch % self.every:
            return None
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                losses = [float(v) for v in self.song_losses(model)]
        finally:
            model.train(training)
        if not losses:
            raise InputError("held-out loss: no held-out song produced a loss")
        loss = sum(losses) / len(losses)
        best = math.isfinite(loss) and loss < self.best
        if best:
            self.best = loss
        self.history.append({"epoch": epoch, "loss": loss})
        if self.events is not None:
            self.events.emit(
                MetricEvent(
                    metric="eval", epoch=epoch, loss=loss, split=self.split, songs=len(losses),
                    best=best,
                )
            )  # fmt: skip
        return loss


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_song_losses(examples: Sequence[LmExample], ce_chunk: int | None = None) -> SongLosses:
    """Mean CE of each held-out LM example through the trainer's loss module."""
    chunk = ce_chunk or lm_vram.DEFAULT_CE_CHUNK

    def losses(model: nn.Module) -> list[float]:
        device = next(model.parameters()).device
        module = lm_loss.LmLossModule(model, chunk)
        out = []
        for i in range(len(examples)):
            batch = collate(examples, ((i,),)).to(device)
            with _autocast(device):
                out.append(float(lm_loss.batch_loss(module, batch)))
        return out

    return losses


def lm_epoch_hook(evaluator: HoldoutEval) -> Callable[[Any, Any], None]:
    """`train_lm(on_epoch=...)` form: (LmSetup, LmTrainState) -> None."""

    def hook(setup: Any, state: Any) -> None:
        evaluator(state.epoch, setup.model)

    return hook


def dit_song_losses(run: Any, held: TensorCache, draws: int = 4) -> SongLosses:
    """Raw flow-matching MSE of each held-out song with per-song fixed draws (`run` is the
    trainer's `DitRun`: models, loss config, crop, device, seed, null condition)."""

    def losses(model: nn.Module) -> list[float]:
        out = []
        for index, song in enumerate(held.songs):
            frames = min(run.fit.crop_frames, song.frames)
            crops = [dit_data.Crop(index, 0, frames, False)] * draws
            batch = dit_data.batch_to(dit_data.assemble(held, crops, frames), run.device)
            rng = dit_data.generator(run.options.seed, "holdout", song.stem)
            t = dit_loss.sample_timesteps(draws, run.loss, rng)
            noise = torch.randn(batch.target_latents.shape, generator=rng, dtype=torch.float32)
            autocast = run.autocast is not None
            with torch.autocast(run.device.type, dtype=run.autocast, enabled=autocast):
                result = dit_loss.flow_matching_loss(
                    run.models,
                    batch,
                    t,
                    noise.to(run.device),
                    torch.zeros(draws, dtype=torch.bool),
                    null_condition=run.null_condition,
                )
            out.append(float(result.raw_loss))
        return out

    return losses


def split_cache(
    cache: TensorCache, fraction: float, seed: int
) -> tuple[TensorCache, TensorCache, HoldoutSplit]:
    """(training cache, held-out cache, split) of a DiT tensor cache, by file stem."""
    split = split_holdout([song.stem for song in cache.songs], fraction, seed)
    train, held = partition_cache(cache, split)
    return train, held, split


def dit_evaluator(run: Any, held: TensorCache, split: HoldoutSplit) -> HoldoutEval:
    """The DiT trainer's per-epoch evaluator (events on the main rank only)."""
    return HoldoutEval(
        dit_song_losses(run, held),
        songs=len(held.songs),
        events=run.events if run.is_main else None,
        info=split.to_dict(),
    )


def dit_epoch_end(run: Any) -> float | None:
    """Held-out loss of the epoch the DiT trainer just finished (`run.holdout`, main rank), kept
    in `run.state.holdout`; the best continues a resumed run's."""
    if run.holdout is None or not run.is_main:
        return None
    finite = [row["loss"] for row in run.state.holdout if math.isfinite(row["loss"])]
    run.holdout.best = min(finite, default=math.inf)
    loss = run.holdout(run.state.epoch, run.transformer)
    if loss is not None:
        run.state.holdout.append({"epoch": run.state.epoch, "loss": loss})
    return loss
