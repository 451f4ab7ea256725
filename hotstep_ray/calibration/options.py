"""What a calibration is asked for, torch-free so the CLI builds its options at start-up.

`CalibrationGrid`: the grid every calibration runs (scales x candidates, `seeds` generations
each), which the LM and DiT calibrators' configs (`LmCalibrationConfig`, `DitCalibrationConfig`)
extend. `CalibrateOptions`: what `calibrate run` takes, the grid plus the LM's sampling (the
audition API's `LmSampling`) and the run's inputs; `grid_fields` and `sampling` hand them to
either config, so every default is the one written here, in `grid` or in `LmSampling`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hotstep_ray.audition.schemas import LmSampling
from hotstep_ray.calibration import grid
from hotstep_ray.core.contracts import LM_CALIBRATION_MAX_BATCH_DEFAULT


class CalibrationGrid(BaseModel):
    """Every candidate (the run's adapter, its milestones) x every scale, each generated `seeds`
    times from consecutive seeds."""

    model_config = ConfigDict(extra="forbid")

    scales: tuple[float, ...] = Field(
        default=grid.DEFAULT_SCALES, description="Adapter scales to try, in (0, 2]."
    )
    seeds: int = Field(
        default=grid.DEFAULT_SEEDS,
        ge=1,
        le=512,
        description="Generations per grid point (prompts cycle the songs).",
    )
    base_seed: int = Field(
        default=grid.DEFAULT_BASE_SEED,
        ge=0,
        le=2**62,
        description="Seed of generation 0 (then +1 each).",
    )

    @field_validator("scales", mode="before")
    @classmethod
    def _scales(cls, value: Any) -> tuple[float, ...]:
        return grid.parse_scales(value)


class CalibrateOptions(LmSampling, CalibrationGrid):
    """`calibrate run`'s options. The sampling fields are the LM's (a DiT run ignores them)."""

    duration_s: float = Field(
        default=0.0,
        ge=0.0,
        le=600.0,
        description="Seconds per generation; 0 = the kind's default (LM: the LM plans it, within "
        "the length guard; DiT: a fixed render length).",
    )
    max_batch: int = Field(
        default=LM_CALIBRATION_MAX_BATCH_DEFAULT,
        ge=1,
        le=64,
        description="LM: generations decoded together (1 = one at a time).",
    )
    codes: str = Field(default="", description="Storage key of lm_codes.jsonl ('' = from the log).")
    tensors: str = Field(default="", description="DiT: tensor cache key ('' = from the log).")
    model: str = Field(
        default="", description="LM or DiT folder under --checkpoints ('' = the run's)."
    )
    device: str = Field(default="", description="cuda, cuda:1, cpu ('' = cuda when present).")
    repoint: bool = Field(
        default=True, description="Make the calibrated folder what the artist resolves to."
    )

    def sampling(self) -> LmSampling:
        return LmSampling(**self.model_dump(include=set(LmSampling.model_fields)))

    def grid_fields(self) -> dict[str, Any]:
        """scales, seeds and base_seed, plus duration_s when one was asked for."""
        fields = self.model_dump(include=set(CalibrationGrid.model_fields))
        return {**fields, "duration_s": self.duration_s} if self.duration_s else fields
