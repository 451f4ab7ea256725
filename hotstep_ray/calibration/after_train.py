"""Calibration as the last step of a training job (`calibrate` of TrainLmOptions/TrainDitOptions).

After a run is trained and exported, its candidates (the kept adapter and every milestone) x the
scale grid are evaluated against the dataset it was trained on (LM: code statistics through the
planner; DiT: latent Fréchet), and the winner is baked into `<run>-calibrated/` with
`hot_step_eval.json`. `calibrate_repoint` decides whether the artist then resolves to the
calibrated folder (True, the default) or stays on the run (`bake` module docstring).

The evaluation loads the base model again from the folder the run trained on (its parent is the
checkpoints folder, its name the model), so it works the same after a plain run and after a Ray
Train job (whose workers are gone by then). With `runner=make_runner(True, ...)` the grid fans out
over Ray actors. A calibration that fails leaves the trained run as it is and fails the job with
the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from hotstep_ray.calibration.ray_calibrate import Runner, run_local
from hotstep_ray.calibration.report import CalibrationOutcome, winner_entry
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage


def check_calibrate(options: Any) -> None:
    """Refuse `calibrate` without the export stage before any training is done."""
    if options.calibrate and "export" not in options.stages:
        raise InputError(
            "calibrate needs the export stage: it evaluates the exported adapter and its "
            f"milestones (stages are {','.join(options.stages)})"
        )


def calibrate_after_training(
    kind: Literal["lm", "dit"],
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
        from hotstep_ray.calibration.lm_calibrate import LmCalibrationConfig, calibrate_lm

        lm_config = LmCalibrationConfig(**(config or {}))
        return calibrate_lm(storage, run_key, config=lm_config, lm=folder.name, **common)
    from hotstep_ray.calibration.dit_calibrate import DitCalibrationConfig, calibrate_dit

    dit_config = DitCalibrationConfig(**(config or {}))
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
