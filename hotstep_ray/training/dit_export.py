"""When and how the DiT trainer writes its adapter files (the formats are `training.export`'s).

export_adapter  PEFT folder (LoRA) or LyCORIS `lokr_weights.safetensors` (LoKR), BF16,
                official module names, trigger and provenance in `__metadata__`; the same
                file(s) under diffusers' module names in `diffusers_names/` inside it, for
                peft and LyCORIS on `AceStepTransformer1DModel` (`export` module docstring)
epoch_export    at an epoch's end: "target" when the target loss stopped the run, "best"
                when the 5-epoch average improved and the last best-export is at least
                `export_interval_s` old, "hold" when it improved sooner (the adapter is kept
                on the CPU, `hold_best`, and exported later or at the end), else nothing
note_saved      what the log records about the file in the run folder
milestone       a `MilestoneTracker` decision carried out under `<run>/milestones/`
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, export
from hotstep_ray.training.dit_state import TrainState
from hotstep_ray.training.schedule import MilestoneTracker

MILESTONE_DIR = layout.MILESTONE_DIR
TRAINER_VERSION = "v1"  # `hot_step_dit_trainer` in every exported file


def export_adapter(
    transformer: torch.nn.Module,
    storage: Storage,
    key: str,
    *,
    kind: str,
    base_model: str,
    variant: str,
    trigger: str | None,
    trigger_position: str,
    zero_groups: Iterable[str],
    target_mlp: bool,
    metadata: dict[str, str] | None = None,
) -> list[str]:
    """The transformer's adapter as the file(s) of its `kind` at `key` (official names) and at
    `key/diffusers_names` (diffusers names); returns the written keys. `zero_groups`: projection
    groups exported as zeros; `target_mlp` goes into the LoKR config."""
    meta = {
        "hot_step_dit_trainer": TRAINER_VERSION,
        "hot_step_base_model": base_model,
        "hot_step_variant": variant,
        **(metadata or {}),
    }
    common: dict[str, Any] = {
        "rename": export.ACESTEP_OFFICIAL_NAMES,
        # peft and LyCORIS load by the names of the model they are given: without this copy a
        # user's diffusers transformer takes only the MLP modules of the official-name file.
        "model_names_dir": export.DIFFUSERS_NAMES_DIR,
        "trigger": trigger,
        "trigger_position": trigger_position,
        "drop_groups": zero_groups,
        "metadata": meta,
    }
    if kind == "lora":
        return export.export_lora(
            transformer, storage, key, base_model_name_or_path=base_model, **common
        )
    extra = {"target_mlp": target_mlp}
    return export.export_lokr(transformer, storage, key, extra_config=extra, **common)


@dataclass
class PendingBest:
    """A best adapter not exported yet (the export interval had not passed)."""

    state: dict[str, torch.Tensor]  # canonical adapter state, on the CPU
    epoch: int
    ma5: float


def hold_best(transformer: torch.nn.Module, epoch: int, ma5: float) -> PendingBest:
    state = {k: v.cpu() for k, v in adapters.adapter_state_dict(transformer).items()}
    return PendingBest(state, epoch, ma5)


def epoch_export(
    state: TrainState,
    target: bool,
    loss: float,
    ma5: float,
    interval_s: float,
    moved: bool = True,
) -> str:
    """Which export the end of epoch `state.epoch` makes (see the module docstring): "target",
    "best", "hold" or "". Records a new best and the target stop in `state`. Until a step with a
    non-zero learning rate has run (`moved`), the adapter is its initialisation (LoRA's B, one
    LoKR factor: zeros), so no epoch can be its best."""
    improved = moved and math.isfinite(ma5) and ma5 < state.best_ma5
    if improved:
        state.best_ma5, state.best_epoch = ma5, state.epoch
    if target:
        state.target_stop = {"epoch": state.epoch, "loss": loss, "ma5": ma5}
        return "target"
    if not improved:
        return ""
    return "best" if time.time() - state.last_export >= interval_s else "hold"


def adapter_moved(factor: Callable[[int], float], steps: int) -> bool:
    """Whether any of the first `steps` optimizer steps ran with a non-zero learning-rate factor
    (the schedule's lr(0) = 0: the first step leaves the adapter as it was initialised)."""
    return any(factor(step) > 0 for step in range(steps))


def never_moved(steps: int) -> str:
    return (
        f"the adapter never changed: all {steps} steps ran at learning rate 0 (the schedule "
        "starts at 0); train more steps for a usable adapter"
    )


def note_saved(state: TrainState, reason: str) -> None:
    """Record the export just written to the run folder (`reason` best|target|final)."""
    state.saved_reason = reason
    state.saved_epoch = state.best_epoch if reason == "best" else len(state.history)
    state.saved_ma5 = None if math.isinf(state.best_ma5) else state.best_ma5
    state.last_export = time.time()


def milestone(
    tracker: MilestoneTracker,
    state: TrainState,
    storage: Storage,
    run_key: str,
    ma5: float,
    write: Callable[[str, dict[str, str]], Any] | None,
    events: EventLog | None = None,
) -> None:
    """Observe epoch `state.epoch`'s `ma5`: delete the milestones pushed out of the kept ones,
    and `write(key, metadata)` the adapter when this epoch is one (None: exports are off)."""
    epoch = state.epoch
    decision = tracker.observe(epoch, ma5)
    for evicted in decision.evict:
        storage.delete(f"{run_key}/{MILESTONE_DIR}/{evicted.name}", recursive=True)
        state.milestones = [m for m in state.milestones if m["name"] != evicted.name]
    if decision.save is None or write is None:
        return
    key = f"{run_key}/{MILESTONE_DIR}/{decision.save.name}"
    write(key, {"hot_step_milestone": decision.save.name})
    state.milestones.append({"name": decision.save.name, "epoch": epoch, "loss": ma5, "path": key})
    if events:
        events.emit(
            MetricEvent(metric="milestone", epoch=epoch, loss=ma5, path=storage.url_of(key))
        )
