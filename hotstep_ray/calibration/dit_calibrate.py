"""DiT adapter calibration: candidates x scales -> latents through `DitAudition` -> latent FD.

Same shape as the LM calibration (`lm_calibrate`): the run's candidates, prompts from the dataset
songs (`<tensors>/lm_codes.jsonl`: captions with the trigger, lyrics, metas) with fixed seeds,
the base model then every candidate x scale on identical requests, run here or on Ray actors.

A render is the audition's text2music path up to the sampler output, without the VAE decode: the
condition (caption + metas, lyrics, silence timbre) encoded once per prompt and cached, the
sampler of the DiT's kind (turbo: 8 fixed steps; base/sft: Euler + APG) from the request's seed,
giving latents [T = duration x 25, 64]. Each render is reduced on the worker to `LatentStats`
(count, mean, M2), so only 64 + 64² numbers per render travel back.

Score = Fréchet distance (squared latent units) between the Gaussian fit of every generated frame
of a grid point and the fit of every `target_latents` frame of the dataset's tensor cache.
Eligible = finite; lowest wins (`grid.pick_winner`). The base row is the reference. Reading the
run, planning, running and baking are the shared `recipe.calibrate_run`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from hotstep_ray.audition.dit_audition import LATENT_HZ, DitAudition
from hotstep_ray.audition.planner import shared_copy
from hotstep_ray.audition.schemas import DitRequest
from hotstep_ray.calibration import metrics
from hotstep_ray.calibration.grid import WorkerFactory, WorkItem, WorkResult
from hotstep_ray.calibration.options import CalibrationGrid
from hotstep_ray.calibration.prompts import Prompt
from hotstep_ray.calibration.ray_calibrate import Runner, run_local
from hotstep_ray.calibration.recipe import KindPlan, calibrate_run
from hotstep_ray.calibration.report import CalibrationOutcome
from hotstep_ray.calibration.runs import RunInfo, codes_key, tensors_key
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.training.lm_data import load_lm_codes

PHASE = "calibrate-dit"
METRIC = {
    "score": "Fréchet distance (squared latent units) between Gaussian fits of the generated "
    "and dataset latent frames (64-d, 25 frames/s); lower is better",
    "frechet": "|mu1 - mu2|^2 + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^1/2), eigh-based square roots",
}


class DitCalibrationConfig(CalibrationGrid):
    duration_s: float = Field(default=10.0, ge=1.0, le=600.0)  # seconds per render
    steps: int | None = Field(default=None, ge=1, le=200)  # turbo: 8 (fixed); base/sft: 30
    guidance_scale: float = Field(default=7.0, ge=0.0, le=20.0)  # base/sft only
    shift: float | None = Field(default=None, ge=1.0, le=5.0)
    include_final: bool = True


def dit_requests(prompts: Sequence[Prompt], config: DitCalibrationConfig) -> list[dict[str, Any]]:
    return [
        DitRequest(
            **prompt.metas(),
            duration=config.duration_s,
            seed=prompt.seed,
            steps=config.steps,
            guidance_scale=config.guidance_scale,
            shift=config.shift,
            base_side=False,
        ).model_dump(mode="json")
        for prompt in prompts
    ]


# -- the worker ----------------------------------------------------------------------------------
class DitWorker:
    """Renders latents for every request of a work item through a `DitAudition`'s models
    (its condition, context and sampler steps; the VAE is never run)."""

    def __init__(self, audition: DitAudition, storage: Storage, max_adapters: int = 2) -> None:
        self.audition, self.storage, self.max_adapters = audition, storage, max_adapters
        self._adapters: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self._conditions: dict[tuple, torch.Tensor] = {}

    def adapter(self, key: str) -> torch.nn.Module:
        from hotstep_ray.training.export import ACESTEP_OFFICIAL_NAMES, load_exported

        if key in self._adapters:
            self._adapters.move_to_end(key)
            return self._adapters[key]
        models = self.audition.models
        copy = shared_copy(models.transformer, share=[models.key_masks])
        load_exported(copy, self.storage, key, rename=ACESTEP_OFFICIAL_NAMES)
        copy.eval().requires_grad_(False)
        self._adapters[key] = copy
        while len(self._adapters) > self.max_adapters:
            self._adapters.popitem(last=False)
        return copy

    def _condition(self, request: DitRequest) -> torch.Tensor:
        key = (request.caption, request.lyrics, request.bpm, request.keyscale,
               request.timesignature, request.language, request.duration)  # fmt: skip
        if key not in self._conditions:
            self._conditions[key] = self.audition._condition(request.caption, request)[0]
        return self._conditions[key]

    @torch.no_grad()
    def latents(
        self, request: DitRequest, transformer: torch.nn.Module | None, scale: float
    ) -> torch.Tensor:
        """[T, 64] float32 latents of one render (T = duration x 25)."""
        from hotstep_ray.training.adapters import set_scale

        models = self.audition.models
        if transformer is not None:
            set_scale(transformer, scale)
            models = dataclasses.replace(models, transformer=transformer)
        frames = int(request.duration * LATENT_HZ)
        context = self.audition.context_latents(request, frames)
        seed = int(request.seed or 0)
        out = self.audition._sample(models, self._condition(request), context, request, seed)
        return out.latents[0].float().cpu()

    def __call__(self, item: WorkItem) -> WorkResult:
        start = time.perf_counter()
        transformer = None if item.is_base else self.adapter(item.key)
        stats, receipts = [], []
        for fields in item.requests:
            latents = self.latents(DitRequest(**fields), transformer, item.scale)
            stats.append(metrics.LatentStats.of(latents))
            receipts.append(hashlib.sha1(latents.numpy().tobytes()).hexdigest())
        return WorkResult(item.index, stats, receipts, (time.perf_counter() - start) * 1000)


@dataclass(frozen=True)
class DitWorkerSpec:
    """Picklable factory of a `DitWorker` (what Ray actors receive)."""

    checkpoints: str
    data: str  # storage root URL
    dit: str | None = None  # DiT folder name under checkpoints (the run's base)
    device: str | None = None
    dtype: str | None = None

    def __call__(self) -> DitWorker:
        audition = DitAudition.from_checkpoints(
            self.checkpoints, dit=self.dit, device=self.device, dtype=self.dtype
        )
        return DitWorker(audition, Storage(self.data))


# -- scoring -------------------------------------------------------------------------------------
def dataset_latents(storage: Storage, key: str) -> metrics.LatentStats:
    """Stats of every `target_latents` frame of the tensor cache at `key`."""
    from hotstep_ray.training.dit_data import load_cache

    total = metrics.LatentStats()
    for song in load_cache(storage, key).songs:
        total = total.merge(metrics.LatentStats.of(song.target))
    return total


def score_dit(
    items: Sequence[WorkItem], results: Sequence[WorkResult], dataset: metrics.LatentStats
) -> list[dict[str, Any]]:
    rows = []
    for item, result in zip(items, results, strict=True):
        merged = metrics.LatentStats()
        for stats in result.outputs:
            merged = merged.merge(stats)
        frechet = metrics.latent_frechet(merged, dataset) if merged.count >= 2 else math.inf
        rows.append(
            {
                "candidate": item.candidate,
                "key": item.key,
                "scale": item.scale,
                "frechet": frechet,
                "score": frechet,
                "frames": merged.count,
                "eligible": math.isfinite(frechet),
                "latents_sha1": list(result.receipts),
                "ms": round(result.ms, 1),
            }
        )
    return rows


def calibrate_dit(
    storage: Storage,
    run_key: str,
    *,
    checkpoints: str | None = None,
    worker: WorkerFactory | None = None,
    config: DitCalibrationConfig | None = None,
    tensors: str = "",
    codes: str = "",
    dit: str | None = None,
    device: str | None = None,
    runner: Runner = run_local,
    events: EventLog | None = None,
    repoint: bool = True,
) -> CalibrationOutcome:
    """Calibrate the DiT run at `run_key` (see the module docstring). `worker` defaults to a
    `DitWorkerSpec` over `checkpoints` with the run's base DiT."""
    config = config or DitCalibrationConfig()

    def prepare(run: RunInfo) -> KindPlan:
        factory = worker
        if factory is None:
            if not checkpoints:
                raise InputError("calibrate_dit needs checkpoints (or a worker factory)")
            factory = DitWorkerSpec(
                str(checkpoints), storage.url, dit or run.dit_name or None, device
            )
        cache = tensors_key(storage, run, tensors)
        key = codes or codes_key(storage, run, f"{cache}/lm_codes.jsonl")
        songs, _ = load_lm_codes(storage, key)
        dataset = dataset_latents(storage, cache)
        return KindPlan(
            worker=factory,
            songs=songs,
            requests=lambda prompts: dit_requests(prompts, config),
            score=lambda items, results: score_dit(items, results, dataset),
            dataset={"tensors": cache, "frames": dataset.count},
        )

    return calibrate_run(
        storage, run_key, "dit", config, prepare, phase=PHASE, metric=METRIC, runner=runner,
        events=events, repoint=repoint,
    )  # fmt: skip
