"""What an LM training run is asked for, and the LM folder it names.

`LmTrainSpec` is one run's request: the options (`TrainLmOptions`), the LM folder, the codes,
the artist, the trigger, and its `LmEngine` (how to run it: placement, batching, memory,
compile); JSON-able, so the Ray driver ships it to its workers. The folder helpers resolve the
LM before anything loads: `resolve_lm_dir` (the official folder of a size, or a named one),
`present_lm_size` (the largest size whose folder is there when the default's is not),
`read_dims` and `lm_size_of` (the size is what the folder's config.json says, never its name),
and `load_tokenizer` (cached per process). No weights are read here.

Separate from the setup because the entry points (the CLI, `main_job`, the studio, the Ray
driver) build a spec and resolve its folder without setting a run up; the warm start
(`lm_start`), the setup (`lm_setup`) and the recipe (`lm`) read the spec, and this module imports
none of them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    LM_ACTIVATION_BUDGET_DEFAULT,
    LM_COMPILE_DEFAULT,
    LmBatching,
    LmCompileMode,
    TrainLmOptions,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.training import lm_vram

CompileMode = LmCompileMode  # the modes live in core.contracts with their default


class LmEngine(BaseModel):
    """How to run (not what to learn): placement, batching, memory, speed."""

    model_config = ConfigDict(extra="forbid")

    device: str = ""  # "" = cuda when present, else cpu
    batching: LmBatching = "single"  # single | bucket (options.batch songs) | pack
    pack_tokens: int = Field(default=0, ge=0)  # row capacity when packing; 0 = 8192 or longest
    # Round row widths up to a multiple of this (fewer compiled shapes); 0 = when the layers are
    # compiled, the multiple of 64-512 that minimises compiles + padding over the run's epochs
    # (`lm_data.pick_pad_multiple`), else 1. Pads are never targets and no real token attends to
    # them.
    pad_multiple: int = Field(default=0, ge=0)
    checkpointing: str = "auto"  # auto | none | full | <layers>
    ce_chunk: int = Field(default=lm_vram.DEFAULT_CE_CHUNK, ge=1)
    attention: str = "sdpa"  # sdpa | varlen | flex_attention | eager
    # torch.compile of each decoder layer (`compile_mode`): auto = reduce-overhead (Inductor +
    # CUDA graphs) on one CUDA GPU when no layer is checkpointed, default when some are or under
    # DDP (`compiling.with_graphs`), off on the CPU, and off for a run too short to repay its
    # compiles (`lm_data.compile_pays`).
    # Compiled layers with graphs are the fastest mode on one GPU; the first step of each new
    # row width compiles (docs/BENCHMARKS.md, rows `lm-4b-modes` and `lm-4b-song`, and the LM
    # table's note on compiling).
    compile: CompileMode = LM_COMPILE_DEFAULT
    # Share of the compiled layers' saved activations that AOTAutograd may keep; below 1 its
    # partitioner recomputes the cheapest ops (norms, SiLU, casts) in the backward instead
    # (torch._functorch activation_memory_budget): a little step time for less reserved memory
    # (row `lm-4b-song` runs at the default). Ignored when the layers run eagerly.
    activation_budget: float = Field(default=LM_ACTIVATION_BUDGET_DEFAULT, gt=0, le=1)
    vram_budget_gib: float = Field(default=0.0, ge=0)  # 0 = free GPU memory - reserve
    vram_reserve_gib: float = Field(default=1.5, ge=0)
    log_every: int = Field(default=10, ge=1)  # optimizer steps between step events
    cot_caption: bool = True  # the CoT repeats the caption (HOT-Step); False = metas only

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_from_bool(cls, value: Any) -> Any:
        """Specs written before the modes had `compile: true/false`."""
        if isinstance(value, bool):
            return "default" if value else "off"
        return value


class LmTrainSpec(BaseModel):
    """Everything one run needs; JSON-able so Ray ships it to workers."""

    model_config = ConfigDict(extra="forbid")

    options: TrainLmOptions
    lm_dir: str  # local folder acestep-5Hz-lm-<size>/
    codes_key: str  # storage key of lm_codes.jsonl
    artist: str  # adapter folder name
    trigger: str = ""  # "" = each row's custom_tag; else this tag for every song
    trigger_position: Literal["prepend", "append", "replace"] = "prepend"
    engine: LmEngine = Field(default_factory=LmEngine)
    run_key: str = ""  # "" = a fresh stamped run folder
    events_key: str = ""  # also append events as JSONL here (Ray workers)
    job_id: str = ""  # the job training the run, kept in its checkpoint (`adapters list`)

    def to_config(self) -> dict[str, Any]:
        """JSON dict that keeps which options were set explicitly (identity adoption needs it)."""
        out = self.model_dump(mode="json", exclude={"options"})
        out["options"] = self.options.model_dump(mode="json", exclude_unset=True)
        return out

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LmTrainSpec:
        return cls(**{**config, "options": TrainLmOptions(**config["options"])})


# -- model folder, size, tokenizer ----------------------------------------------------------------
def resolve_lm_dir(checkpoints: str | Path, size: str, lm_model: str = "") -> Path:
    """`<checkpoints>/acestep-5Hz-lm-<size>` or the named folder (a path, or a name under
    checkpoints)."""
    if lm_model:
        path = Path(lm_model)
        folder = path if path.is_dir() else Path(checkpoints) / lm_model
    elif size in layout.LM_SIZE_FOLDERS:
        folder = Path(checkpoints) / f"acestep-5Hz-lm-{size}"  # the official folder name
    else:
        raise InputError(
            f"unknown LM size {size!r}; expected one of {list(layout.LM_SIZE_FOLDERS)}"
        )
    if not (folder / "config.json").is_file():
        raise InputError(f"{folder}: no LM checkpoint (config.json missing)")
    return folder


def present_lm_size(checkpoints: str | Path, preferred: str) -> str:
    """`preferred` when its official LM folder is in `checkpoints`, else the largest LM size that
    is (a tree with only the 1.7B trains the 1.7B rather than failing on the missing 4B); else
    `preferred`, whose folder `resolve_lm_dir` then reports missing."""
    present = [
        size
        for size in layout.LM_SIZE_FOLDERS
        if (Path(checkpoints) / f"acestep-5Hz-lm-{size}" / "config.json").is_file()
    ]
    if preferred in present or not present:
        return preferred
    return max(present, key=lambda size: float(size.rstrip("B")))


def lm_size_of(dims: lm_vram.LmDims, requested: str, explicit: bool = True) -> str:
    """The size label from the architecture (the folder's config.json). A known architecture
    wins over a size nobody asked for (`explicit=False`: the contract's default) and must match
    one that was asked for (else a mislabelled folder or the wrong --size: an error); an unknown
    architecture (a tiny test LM) keeps the requested size."""
    found = dims.size_label
    if found is not None and found != requested and explicit:
        raise InputError(
            f"the LM folder holds a {found} model (hidden {dims.hidden}, {dims.layers} layers), "
            f"not {requested}; pass --size {found}, leave --size out, or pick the right folder"
        )
    return found or requested


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str, stamp: float) -> Any:
    from hotstep_ray.models import lm_tokenizer  # tokenizers + transformers: only when loading

    return lm_tokenizer.load_tokenizer(folder)


def load_tokenizer(folder: str | Path) -> Any:
    """The LM folder's tokenizer, cached per process (loading it takes seconds)."""
    path = Path(folder)
    return _tokenizer(str(path.resolve()), (path / "tokenizer.json").stat().st_mtime)


def read_dims(lm_dir: str | Path) -> lm_vram.LmDims:
    """The LM's shape numbers from its folder's config.json (no weights read)."""
    config = json.loads((Path(lm_dir) / "config.json").read_text(encoding="utf-8"))
    return lm_vram.LmDims.from_config(config)
