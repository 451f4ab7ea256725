"""The calibration recipe shared by the LM and the DiT: read the run -> worker -> grid -> bake.

1. `runs.read_run`: the run's candidates (its adapter, its milestones), log and trigger; a run
   of the other kind is refused.
2. `prepare(run)` (the kind's part): the worker factory, the dataset songs the prompts come
   from, how prompts become requests, how results are scored, what to record of the dataset.
3. `prompts.song_prompts` -> requests -> `grid.plan_items` (the base row, then every
   candidate x scale on identical requests), run by `runner` (here or on Ray actors) with
   `progress` events.
4. Rows scored by the kind, `grid.pick_winner`, `eval` events, `hot_step_eval.json` and the
   winner baked into `<run>-calibrated/` (`bake.write_calibrated`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from hotstep_ray.calibration import bake, grid
from hotstep_ray.calibration.grid import WorkerFactory, WorkItem, WorkResult
from hotstep_ray.calibration.prompts import Prompt, song_prompts
from hotstep_ray.calibration.ray_calibrate import Runner
from hotstep_ray.calibration.report import (
    CalibrationOutcome,
    emit_rows,
    progress_reporter,
    verdict,
    winner_entry,
)
from hotstep_ray.calibration.runs import RunInfo, RunKind, read_run
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.training.lm_data import LmSong

Score = Callable[[Sequence[WorkItem], Sequence[WorkResult]], list[dict[str, Any]]]


@dataclass
class KindPlan:
    """What one kind of calibration brings to the recipe, for one run."""

    worker: WorkerFactory
    songs: list[LmSong]  # the dataset songs the prompts cycle over
    requests: Callable[[Sequence[Prompt]], list[dict[str, Any]]]  # prompts -> request fields
    score: Score  # one row per item, the base row first
    dataset: dict[str, Any]  # hot_step_eval.json's `dataset` section


def calibrate_run(
    storage: Storage,
    run_key: str,
    kind: RunKind,
    config: BaseModel,
    prepare: Callable[[RunInfo], KindPlan],
    *,
    phase: str,
    metric: dict[str, str],
    runner: Runner,
    events: EventLog | None = None,
    repoint: bool = True,
) -> CalibrationOutcome:
    """The recipe (module docstring). `config` carries scales, seeds, base_seed, include_final
    and is written into the report as it is."""
    settings: Any = config
    run = read_run(storage, run_key, settings.include_final)
    if run.kind != kind:
        other = "DiT" if run.kind == "dit" else "LM"
        raise InputError(f"{run_key} is an {other} run; use the {other} calibration")
    plan = prepare(run)
    prompts = song_prompts(
        plan.songs, settings.seeds, settings.base_seed, run.trigger, run.trigger_position
    )
    items = grid.plan_items(run.candidates, settings.scales, plan.requests(prompts))
    if events is not None:
        names = ", ".join(c.name for c in run.candidates)
        events.log(
            f"{phase}: {len(run.candidates)} candidates ({names}) x {len(settings.scales)} "
            f"scales x {settings.seeds} seeds, + base; {len(plan.songs)} dataset songs"
        )
    results = runner(items, plan.worker, progress_reporter(events, phase))
    rows = plan.score(items, results)
    winner = grid.pick_winner(rows, [c.name for c in run.candidates])
    emit_rows(events, rows, winner)
    document = bake.eval_document(
        kind,
        run,
        metric=metric,
        config=config.model_dump(mode="json"),
        seeds=[p.seed for p in prompts],
        prompts=[p.to_dict() for p in prompts],
        dataset=plan.dataset,
        candidates=[c.to_dict() for c in run.candidates],
        base=rows[0],
        grid=rows[1:],
        winner=winner_entry(winner),
    )
    folder = bake.write_calibrated(storage, run, document, winner, repoint=repoint)
    if events is not None:
        events.log(verdict(winner, folder, storage), "info" if winner else "warn")
    return CalibrationOutcome(run, rows, winner, folder, storage.read_json(folder.eval_key))
