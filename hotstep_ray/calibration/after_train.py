"""Train, then calibrate: the `calibrate` option of TrainLmOptions/TrainDitOptions, composed here.

The trainers only train (`training/` never imports calibration; given `calibrate=True` they refuse
and name the function below). These functions call a trainer with `calibrate` off and, once the
run is trained and exported, evaluate its candidates (the kept adapter and every milestone) x the
scale grid against the dataset it was trained on (LM: code statistics through the planner; DiT:
latent Fréchet), and bake the winner into `<run>-calibrated/` with `hot_step_eval.json`.
`calibrate_repoint` decides whether the artist then resolves to the calibrated folder (True, the
default) or stays on the run (`bake` module docstring).

    run_lm_then_calibrate            lm.run_lm_training, then the LM grid in this process
    run_lm_on_ray_then_calibrate     ray_lm.run_lm_on_ray, then the LM grid on Ray actors
    train_dit_on_ray_then_calibrate  ray_dit.train_dit_on_ray, then the DiT grid on Ray actors
    calibrate_dit_run                the DiT grid after an in-process run (`train-dit --no-ray`)

The three `..._then_calibrate` check the options before any training (`check_calibrate`, the grid
overrides) and, without `calibrate`, only train. The evaluation loads the base model again from the folder the
run trained on (its parent is the checkpoints folder, its name the model), so it works the same
after a plain run and after a Ray Train job (whose workers are gone by then); on Ray the grid fans
out over one actor per training worker. A DiT run paused at `max_steps` is not calibrated (its
milestones are not all there yet). A calibration that fails leaves the trained run as it is and
fails the job with the reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch

from hotstep_ray.calibration.ray_calibrate import Runner, make_runner, run_local
from hotstep_ray.calibration.report import CalibrationOutcome, winner_entry
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, jsonl_sink
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit, lm, lm_save, lm_spec, ray_dit, ray_lm

Kind = Literal["lm", "dit"]


def check_calibrate(options: Any) -> None:
    """Refuse `calibrate` without the export stage before any training is done."""
    if options.calibrate and "export" not in options.stages:
        raise InputError(
            "calibrate needs the export stage: it evaluates the exported adapter and its "
            f"milestones (stages are {','.join(options.stages)})"
        )


def calibration_config(kind: Kind, config: dict[str, Any] | None = None) -> Any:
    """`LmCalibrationConfig` / `DitCalibrationConfig` from the overrides (raises when invalid)."""
    if kind == "lm":
        from hotstep_ray.calibration.lm_calibrate import LmCalibrationConfig

        return LmCalibrationConfig(**(config or {}))
    from hotstep_ray.calibration.dit_calibrate import DitCalibrationConfig

    return DitCalibrationConfig(**(config or {}))


def calibrate_after_training(
    kind: Kind,
    storage: Storage,
    run_key: str,
    model_dir: str | Path,
    *,
    repoint: bool = True,
    config: dict[str, Any] | None = None,
    device: str | None = None,
    runner: Runner = run_local,
    events: EventLog | None = None,
) -> CalibrationOutcome:
    """Calibrate the freshly trained run at `run_key`; `model_dir` is the base model folder it
    trained on, `config` overrides of `LmCalibrationConfig` / `DitCalibrationConfig`."""
    folder = Path(model_dir)
    if events is not None:
        events.log(f"calibrating {storage.url_of(run_key)} (milestones x scales)")
    common: dict[str, Any] = {
        "checkpoints": str(folder.parent),
        "device": device or None,
        "runner": runner,
        "events": events,
        "repoint": repoint,
    }
    if kind == "lm":
        from hotstep_ray.calibration.lm_calibrate import calibrate_lm

        lm_config = calibration_config("lm", config)
        return calibrate_lm(storage, run_key, config=lm_config, lm=folder.name, **common)
    from hotstep_ray.calibration.dit_calibrate import calibrate_dit

    dit_config = calibration_config("dit", config)
    return calibrate_dit(storage, run_key, config=dit_config, dit=folder.name, **common)


def summary(outcome: CalibrationOutcome, storage: Storage) -> dict[str, Any]:
    """What a training result reports of its calibration."""
    return {
        "folder": outcome.folder.key,
        "eval": outcome.folder.eval_key,
        "weights": outcome.folder.weights_key,
        "winner": winner_entry(outcome.winner),
        "url": storage.url_of(outcome.folder.weights_key or outcome.folder.eval_key),
    }


def _train_only(options: Any) -> Any:
    """`options` with `calibrate` off: what a trainer is given (it refuses `calibrate`)."""
    return options.model_copy(update={"calibrate": False}) if options.calibrate else options


def _lm_train_only(spec: lm_spec.LmTrainSpec) -> lm_spec.LmTrainSpec:
    return spec.model_copy(update={"options": _train_only(spec.options)})


# =============================================================================== LM


def calibrate_lm_run(
    spec: lm_spec.LmTrainSpec,
    storage: Storage,
    result: lm_save.LmRunResult,
    events: EventLog | None = None,
    runner: Runner = run_local,
    calibration: dict[str, Any] | None = None,
) -> lm_save.LmRunResult:
    """Milestones x scales of the exported LM run, baked into `<run>-calibrated/`: `result`
    with its `calibration` summary."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the trained model is gone; the base loads again to evaluate
    outcome = calibrate_after_training(
        "lm",
        storage,
        result.run_key,
        spec.lm_dir,
        repoint=spec.options.calibrate_repoint,
        config=calibration,
        device=spec.engine.device or None,
        runner=runner,
        events=events,
    )
    return dataclasses.replace(result, calibration=summary(outcome, storage))


def run_lm_then_calibrate(
    spec: lm_spec.LmTrainSpec,
    storage: Storage,
    *,
    events: EventLog | None = None,
    calibration: dict[str, Any] | None = None,
    **training: Any,
) -> lm_save.LmRunResult:
    """`lm.run_lm_training(spec, storage, events=events, **training)`, then with `calibrate` the
    calibration of the finished run in this process. `calibration`: `LmCalibrationConfig`
    overrides."""
    check_calibrate(spec.options)
    if spec.options.calibrate:
        calibration_config("lm", calibration)  # bad overrides fail before the training
    result = lm.run_lm_training(_lm_train_only(spec), storage, events=events, **training)
    if not (spec.options.calibrate and result.finished):  # an interrupted run waits
        return result
    return calibrate_lm_run(spec, storage, result, events, calibration=calibration)


def run_lm_on_ray_then_calibrate(
    spec: lm_spec.LmTrainSpec,
    storage: Storage,
    *,
    events: EventLog | None = None,
    calibration: dict[str, Any] | None = None,
    **training: Any,
) -> lm_save.LmRunResult:
    """`ray_lm.run_lm_on_ray(spec, storage, events=events, **training)`, then with `calibrate`
    the calibration on as many Ray actors as the job had workers. Its events go to `events`,
    else to `spec.events_key`, as the driver's side of the training does."""
    check_calibrate(spec.options)
    if spec.options.calibrate:
        calibration_config("lm", calibration)
    if events is None and spec.events_key:
        events = EventLog(jsonl_sink(storage, spec.events_key))
    result = ray_lm.run_lm_on_ray(_lm_train_only(spec), storage, events=events, **training)
    if not (spec.options.calibrate and result.finished):
        return result
    actors, address = training.get("num_workers", 1), training.get("ray_address")
    runner = make_runner(True, actors=actors, address=address)
    return calibrate_lm_run(spec, storage, result, events, runner, calibration)


# =============================================================================== DiT


def dit_calibration_skipped(events: EventLog | None) -> None:
    """A run paused at max_steps is not calibrated: its milestones are not all there yet."""
    if events is not None:
        events.log("paused at max_steps: calibration waits for the resumed run", "warn")


def calibrate_dit_run(
    options: TrainDitOptions,
    storage: Storage,
    run_key: str,
    dit_folder: str | Path,
    events: EventLog | None = None,
    calibration: dict[str, Any] | None = None,
    actors: int = 0,
) -> dict[str, Any]:
    """Milestones x scales of a finished DiT run, baked into `<run>-calibrated/`: on `actors`
    Ray actors, or in this process when 0. Returns the calibration summary."""
    outcome = calibrate_after_training(
        "dit",
        storage,
        run_key,
        dit_folder,
        repoint=options.calibrate_repoint,
        config=calibration,
        runner=make_runner(actors > 0, actors=max(1, actors)),
        events=events,
    )
    return summary(outcome, storage)


def train_dit_on_ray_then_calibrate(
    options: TrainDitOptions,
    storage: Storage,
    dataset: str,
    settings: dit.DitSettings | None = None,
    *,
    events: EventLog | None = None,
    calibration: dict[str, Any] | None = None,
    **training: Any,
) -> ray_dit.RayDitResult:
    """`ray_dit.train_dit_on_ray(options, storage, dataset, settings, **training)`, then with
    `calibrate` the calibration on as many Ray actors as the job had workers, in
    `RayDitResult.calibration`. `calibration`: `DitCalibrationConfig` overrides; `events`
    default to the job's events.jsonl when `job_id` is given."""
    check_calibrate(options)
    if options.calibrate:
        calibration_config("dit", calibration)
    done = ray_dit.train_dit_on_ray(_train_only(options), storage, dataset, settings, **training)
    if not options.calibrate:
        return done
    job_id = training.get("job_id")
    if events is None and job_id:
        events = EventLog(jsonl_sink(storage, layout.job_events(job_id)))
    if done.log.get("stop_reason") == "max_steps":
        dit_calibration_skipped(events)
    else:
        actors = training.get("num_workers", 1)
        done.calibration = calibrate_dit_run(
            options, storage, done.run_key, done.dit_folder, events, calibration, actors
        )
    return done
