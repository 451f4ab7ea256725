"""Bake the calibration winner into `<run>-calibrated/` next to the run.

Folding the scale. A loader applies ΔW = s_file · f(tensors) (LoRA: f = B·A, s_file = α/r from
the config or a `.alpha` key; LoKR: f = w1 ⊗ w2, s_file = alpha/dim or 1). Baking multiplies ONE
factor by the chosen scale a, so every loader applies a·ΔW at its own scale 1 with nothing else
changed (config, alphas, shapes):
    LoRA  lora_B <- a · lora_B                         ΔW' = s_file · (a B) A = a ΔW
    LoKR  lokr_w2 <- a · lokr_w2 (or lokr_w2_a <- a · lokr_w2_a when w2 is factored)
                                                       ΔW' = s_file · w1 ⊗ (a w2) = a ΔW
The product is taken in float32 and rounded once to the file's dtype (BF16 for our exports).

The folder (written in this order; weights last, since weights are what makes a folder a run):
    hot_step_eval.json        grid, scores, guards, seeds, prompts, winner (format hot-step-eval-v1)
    lm_train_log.json | dit_train_log.json    copied from the run (size and identity readers)
    adapter_config.json + adapter_model.safetensors | lokr_weights.safetensors   the baked winner,
                              with `hot_step_calibrated*` keys and the run's trigger in __metadata__
A recalibration replaces the folder. With no eligible winner only `hot_step_eval.json` is written
(no weights: nothing resolves to the folder).

`calibrateRepoint` (TrainLmOptions/TrainDitOptions.calibrate_repoint, default true). Consumers that
resolve an artist's newest run (`layout.resolve_adapter`, the audition catalogue) take the
name-last folder holding weights, and `<run>-calibrated` sorts right after `<run>`:
    repoint=True   weights in `<run>-calibrated/`: the calibrated adapter becomes what the artist
                   resolves to (HOT-Step repoints the album presets to it).
    repoint=False  weights in `<run>-calibrated/baked/` (not a run folder: no weights at its top),
                   so the artist keeps resolving to `<run>`; the baked adapter is there to copy.
Either way `-calibrated` folders are never a resume source:
`layout.latest_run_dir(..., skip_calibrated=True)` skips them (the trainers' `init_adapter=latest`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import torch
from safetensors.torch import save as save_safetensors_bytes

from hotstep_ray import __version__
from hotstep_ray.calibration.runs import DIT_LOG, LM_LOG, RunInfo, calibrated_key
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import export

EVAL_FILE = "hot_step_eval.json"
EVAL_FORMAT = "hot-step-eval-v1"
BAKED_SUBDIR = "baked"
PRODUCER = f"hotstep-ray {__version__} calibration"


def _fold(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    return (tensor.float() * scale).to(tensor.dtype).contiguous()


def scale_tensors(
    kind: str, tensors: Mapping[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """A copy of an adapter file's tensors with `scale` folded into one factor per module."""
    out = dict(tensors)
    if kind == "lora":
        keys = [k for k in tensors if k.endswith("lora_B.weight")]
        if not keys:
            raise InputError("LoRA file without lora_B tensors: cannot fold a scale")
        for key in keys:
            out[key] = _fold(tensors[key], scale)
        return out
    stems = {k.rsplit(".", 1)[0] for k in tensors}
    for stem in stems:
        for suffix in ("lokr_w2", "lokr_w2_a", "lokr_w1", "lokr_w1_a"):
            if f"{stem}.{suffix}" in tensors:
                out[f"{stem}.{suffix}"] = _fold(tensors[f"{stem}.{suffix}"], scale)
                break
    return out


def bake_adapter(
    storage: Storage,
    source_key: str,
    dest_key: str,
    scale: float,
    *,
    metadata: Mapping[str, Any] | None = None,
    trigger: tuple[str, str] | None = None,
) -> list[str]:
    """Write the adapter at `source_key` with `scale` folded in to `dest_key`; returns the keys.
    `trigger` (word, position) is embedded when the source carries none."""
    kind, tensors, meta = export.read_adapter_file(storage, source_key)
    meta = dict(meta)
    if trigger and trigger[0] and not meta.get("hot_step_trigger"):
        meta.update(export.trigger_metadata(trigger[0], trigger[1]))  # type: ignore[arg-type]
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    written = []
    if kind == "lora":
        config_key = f"{source_key}/{export.LORA_CONFIG_FILE}"
        if storage.exists(config_key):
            written.append(f"{dest_key}/{export.LORA_CONFIG_FILE}")
            storage.copy(config_key, written[-1])
        name = export.LORA_WEIGHTS_FILE
    else:
        name = export.LOKR_WEIGHTS_FILE
    data = save_safetensors_bytes(scale_tensors(kind, tensors, scale), metadata=meta)
    written.append(f"{dest_key}/{name}")
    storage.write_bytes(written[-1], data)
    return written


@dataclass(frozen=True)
class CalibratedFolder:
    key: str  # <run>-calibrated
    weights_key: str  # where the baked adapter is ("" when no winner)
    eval_key: str
    files: tuple[str, ...]


def write_calibrated(
    storage: Storage,
    run: RunInfo,
    document: dict[str, Any],
    winner: Mapping[str, Any] | None,
    *,
    repoint: bool = True,
) -> CalibratedFolder:
    """Write `<run>-calibrated/` (see the module docstring); `document` is hot_step_eval.json
    (its `baked` entry is filled in here)."""
    folder = calibrated_key(run.run_key)
    storage.delete(folder, recursive=True)
    weights_key = ""
    if winner is not None:
        weights_key = folder if repoint else f"{folder}/{BAKED_SUBDIR}"
    document = {
        **document,
        "calibrated": folder,
        "repoint": repoint,
        "baked": None
        if winner is None
        else {
            "path": weights_key,
            "source": winner["key"],
            "candidate": winner["candidate"],
            "scale": winner["scale"],
        },
    }
    eval_key = f"{folder}/{EVAL_FILE}"
    storage.write_json(eval_key, document)
    files = [eval_key]
    for log in (LM_LOG, DIT_LOG):
        if storage.exists(f"{run.run_key}/{log}"):
            storage.copy(f"{run.run_key}/{log}", f"{folder}/{log}")
            files.append(f"{folder}/{log}")
    if winner is not None:
        files += bake_adapter(
            storage,
            winner["key"],
            weights_key,
            float(winner["scale"]),
            metadata={
                "hot_step_calibrated": "v1",
                "hot_step_calibrated_scale": f"{float(winner['scale']):g}",
                "hot_step_calibrated_from": winner["candidate"],
                "hot_step_calibrated_run": run.run_key,
                "hot_step_calibrated_score": f"{float(winner['score']):.6g}",
            },
            trigger=(run.trigger, run.trigger_position) if run.trigger else None,
        )
    return CalibratedFolder(folder, weights_key, eval_key, tuple(files))


def eval_document(kind: str, run: RunInfo, **sections: Any) -> dict[str, Any]:
    """The common head of hot_step_eval.json; `sections` are kind-specific (config, metric,
    dataset, prompts, candidates, base, grid, winner)."""
    return {
        "format": EVAL_FORMAT,
        "producer": PRODUCER,
        "created_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "kind": kind,
        "run": run.run_key,
        "trigger": {"word": run.trigger, "position": run.trigger_position},
        **_finite(json.loads(json.dumps(sections, default=_jsonable))),
    }


def _finite(value: Any) -> Any:
    """Non-finite floats become null (strict JSON has no Infinity/NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
