"""LM adapter calibration: candidates x scales -> codes through `PlannerLM` -> scores -> winner.

1. The run's candidates (its own adapter and every milestone, `runs.find_candidates`) and the
   dataset's songs (`lm_codes.jsonl`, from the run log or `codes=`).
2. Prompts: `seeds` generations cycling over the songs, seed `base_seed + i` (`prompts`).
3. Work items: the base model, then every candidate x scale, all with the same requests; run by a
   worker (one `PlannerLM`, adapters loaded onto shared copies of the base weights and cached) here
   or on Ray actors (`ray_calibrate`). Requests pass `use_trigger=False`: the caption already
   carries the trigger the way training rendered it, for the base and every candidate alike.
4. Scores (`metrics`): D_marg + D_trans in bits against the dataset codes; memorisation guard
   (> 25 codes copied from one training song trips); length guard (mean codes >= 60 % of base).
5. Winner (`grid.pick_winner`) baked into `<run>-calibrated/` with `hot_step_eval.json`
   (`bake.write_calibrated`); with no eligible row only the report is written.
Steps 1, 3 (planning, running) and 5 are the shared `recipe.calibrate_run`; this module holds the
LM's requests, worker and scores.

Length. The planner emits exactly duration x 5 codes, so lengths differ only when the LM plans
the duration itself: `duration_s=None` (the default) leaves it to phase 1 (the other metas stay
pinned to the song's) and the length guard measures the adapter's planning. A fixed `duration_s`
is cheaper (no CoT, fixed cost per item) but makes the length guard pass trivially.

Batching. The worker decodes an item's requests `max_batch` at a time (`PlannerLM.generate_batch`:
one batch of 2 x max_batch CFG rows, about the per-step cost of one request's 2 rows, since
decoding is memory-bound); phase 1, where the LM plans the duration, still runs per request
before the batch. Batched codes are reproducible for a given `max_batch` but not byte-identical to
single-request generation with the same seeds (other GEMM shapes, more padding, so other float
rounding): calibration compares items with each other, every item generated the same way, and
needs no match with `/lm`. Receipts (`codes_sha1`) stay per request. `max_batch=1` is the
sequential path, one `PlannerLM.generate` per request.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from hotstep_ray.audition.planner import LoadedLm, PlannerLM, shared_copy
from hotstep_ray.audition.schemas import LmRequest, LmSampling
from hotstep_ray.calibration import metrics
from hotstep_ray.calibration.grid import WorkerFactory, WorkItem, WorkResult
from hotstep_ray.calibration.options import CalibrationGrid
from hotstep_ray.calibration.prompts import Prompt
from hotstep_ray.calibration.ray_calibrate import Runner, run_local
from hotstep_ray.calibration.recipe import KindPlan, calibrate_run
from hotstep_ray.calibration.report import CalibrationOutcome
from hotstep_ray.calibration.runs import RunInfo, codes_key
from hotstep_ray.core.contracts import LM_CALIBRATION_MAX_BATCH_DEFAULT
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.training.lm_data import load_lm_codes

PHASE = "calibrate-lm"
# requests decoded together (1 = one at a time)
DEFAULT_MAX_BATCH = LM_CALIBRATION_MAX_BATCH_DEFAULT
METRIC = {
    "score": "marginal + transition, bits in [0, 2]; lower is better",
    "marginal": "Jensen-Shannon divergence (log2) of the generated vs dataset code histograms",
    "transition": "Jensen-Shannon divergence (log2) of the in-sequence bigram histograms",
    "memorisation": "longest generated run verbatim in one training song; trips above the limit",
    "length": "mean generated codes / the base model's on the same prompts; passes at the floor",
}


class LmCalibrationConfig(CalibrationGrid):
    duration_s: float | None = Field(default=None, ge=1.0, le=600.0)  # None: the LM plans it
    sampling: LmSampling = Field(default_factory=LmSampling)
    memorisation_limit_codes: int = Field(default=metrics.MEMORISATION_LIMIT_CODES, ge=1)
    length_floor: float = Field(default=metrics.LENGTH_FLOOR, ge=0.0, le=1.0)
    include_final: bool = True  # the run's own adapter is a candidate besides the milestones
    max_batch: int = Field(default=DEFAULT_MAX_BATCH, ge=1, le=64)  # requests decoded together


def lm_requests(prompts: Sequence[Prompt], config: LmCalibrationConfig) -> list[dict[str, Any]]:
    """One validated LmRequest (as a JSON dict) per prompt."""
    return [
        LmRequest(
            **prompt.metas(),
            **config.sampling.model_dump(),
            duration=config.duration_s,
            lm_seed=prompt.seed,
            use_trigger=False,
        ).model_dump(mode="json")
        for prompt in prompts
    ]


# -- the worker ----------------------------------------------------------------------------------
class LmWorker:
    """Generates every request of a work item: the base model, or an adapter folder (loaded onto a
    shared copy of the base weights, `max_adapters` kept) at the item's scale; `max_batch`
    requests at a time (see "Batching" above; 1 = one `generate` per request)."""

    def __init__(
        self,
        planner: PlannerLM,
        storage: Storage,
        max_adapters: int = 2,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch}: expected >= 1")
        self.planner, self.storage, self.max_adapters = planner, storage, max_adapters
        self.max_batch = max_batch
        self._cache: OrderedDict[str, LoadedLm] = OrderedDict()

    def adapter(self, key: str) -> LoadedLm:
        from hotstep_ray.training.export import load_exported

        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        model = shared_copy(self.planner.base.model)
        load_exported(model, self.storage, key)
        model.eval().requires_grad_(False)
        self._cache[key] = LoadedLm(name=f"calibrate:{key}", model=model, key=key)
        while len(self._cache) > self.max_adapters:
            self._cache.popitem(last=False)
        return self._cache[key]

    def __call__(self, item: WorkItem) -> WorkResult:
        start = time.perf_counter()
        adapter = None if item.is_base else self.adapter(item.key)
        scale = item.scale if adapter is not None else 1.0
        requests = [LmRequest(**{**fields, "lm_adapter_scale": scale}) for fields in item.requests]
        if self.max_batch == 1:
            results = [self.planner.generate(request, adapter) for request in requests]
        else:
            results = []
            for first in range(0, len(requests), self.max_batch):
                chunk = requests[first : first + self.max_batch]
                results += self.planner.generate_batch(chunk, adapter)
        codes = [list(result.codes) for result in results]
        receipts = [result.codes_sha1 for result in results]
        return WorkResult(item.index, codes, receipts, (time.perf_counter() - start) * 1000)


@dataclass(frozen=True)
class LmWorkerSpec:
    """Picklable factory of an `LmWorker` (what Ray actors receive)."""

    checkpoints: str
    data: str  # storage root URL
    lm: str | None = None  # LM folder name under checkpoints; None = the first usable one
    expected_size: str = ""  # refuse an LM of another size ("" = no check)
    device: str | None = None
    dtype: str | None = None
    decode_mode: str = "auto"  # CUDA graphs on CUDA, eager on CPU
    max_batch: int = DEFAULT_MAX_BATCH  # requests decoded together (1 = one at a time)
    # Adapters stay unmerged here: each candidate and scale would get a merged copy of the
    # adapted weights (4B, every projection: ~6.6 GiB each, two kept), which a worker sized for
    # the LM alone may not have; the sweep's own measured speed is the unmerged one.
    merge_adapters: str = "off"

    def __call__(self) -> LmWorker:
        planner = PlannerLM.from_checkpoints(
            self.checkpoints,
            lm=self.lm or lm_folder_of_size(self.checkpoints, self.expected_size),
            device=self.device,
            dtype=self.dtype,
            decode_mode=self.decode_mode,
            merge_adapters=self.merge_adapters,
        )
        if self.expected_size and planner.lm_size != self.expected_size:
            raise InputError(
                f"the run was trained on the {self.expected_size} LM; {self.checkpoints} gave "
                f"{planner.lm_size} (pass --model with the right folder)"
            )
        return LmWorker(planner, Storage(self.data), max_batch=self.max_batch)


def lm_folder_of_size(checkpoints: str, lm_size: str) -> str | None:
    """Name of the first usable LM folder of `lm_size` under `checkpoints` (None: let the
    planner pick, and the size check above refuse a mismatch)."""
    from hotstep_ray.models.discovery import discover

    if not lm_size:
        return None
    for info in discover(checkpoints):
        if info.kind == "lm" and info.usable and info.variant == lm_size:
            return info.name
    return None


# -- scoring -------------------------------------------------------------------------------------
def score_lm(
    items: Sequence[WorkItem],
    results: Sequence[WorkResult],
    dataset: metrics.DatasetCodes,
    index: metrics.CorpusIndex,
    config: LmCalibrationConfig,
) -> list[dict[str, Any]]:
    """One row per item (the base first); see the module docstring."""
    base_lengths = [len(c) for c in results[0].outputs]
    rows = []
    for item, result in zip(items, results, strict=True):
        generated = result.outputs
        marginal = metrics.js_divergence(metrics.code_histogram(generated), dataset.marginal)
        transition = metrics.js_divergence(metrics.bigram_histogram(generated), dataset.bigrams)
        memo = metrics.memorisation_guard(
            generated, index, dataset.names, config.memorisation_limit_codes
        )
        length = metrics.length_guard(
            [len(c) for c in generated], base_lengths, config.length_floor
        )
        rows.append(
            {
                "candidate": item.candidate,
                "key": item.key,
                "scale": item.scale,
                "marginal": marginal,
                "transition": transition,
                "score": marginal + transition,
                "memorisation": memo.to_dict(),
                "length": length.to_dict(),
                "eligible": not memo.tripped and length.passed,
                "codes_count": [len(c) for c in generated],
                "codes_sha1": list(result.receipts),
                "ms": round(result.ms, 1),
            }
        )
    return rows


# -- the whole calibration -----------------------------------------------------------------------
def calibrate_lm(
    storage: Storage,
    run_key: str,
    *,
    checkpoints: str | None = None,
    worker: WorkerFactory | None = None,
    config: LmCalibrationConfig | None = None,
    codes: str = "",
    lm: str | None = None,
    device: str | None = None,
    runner: Runner = run_local,
    events: EventLog | None = None,
    repoint: bool = True,
) -> CalibrationOutcome:
    """Calibrate the LM run at `run_key` (see the module docstring). `worker` defaults to an
    `LmWorkerSpec` over `checkpoints` with the run's LM size."""
    config = config or LmCalibrationConfig()

    def prepare(run: RunInfo) -> KindPlan:
        factory = worker
        if factory is None:
            if not checkpoints:
                raise InputError("calibrate_lm needs checkpoints (or a worker factory)")
            factory = LmWorkerSpec(
                str(checkpoints), storage.url, lm, run.lm_size, device, max_batch=config.max_batch
            )
        key = codes_key(storage, run, codes)
        songs, _ = load_lm_codes(storage, key)
        dataset = metrics.DatasetCodes.from_songs(
            [s.codes for s in songs], [s.song_id for s in songs]
        )
        index = metrics.CorpusIndex(dataset.songs)
        return KindPlan(
            worker=factory,
            songs=songs,
            requests=lambda prompts: lm_requests(prompts, config),
            score=lambda items, results: score_lm(items, results, dataset, index, config),
            dataset={"codes": key, "songs": len(songs), "total_codes": dataset.total_codes},
        )

    return calibrate_run(
        storage, run_key, "lm", config, prepare, phase=PHASE, metric=METRIC, runner=runner,
        events=events, repoint=repoint,
    )  # fmt: skip
