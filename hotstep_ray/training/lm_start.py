"""Where an LM run's adapter starts: the identity an adapter must share to be continued, and
the warm start (`init_adapter`) a run resolves to. No model weights are loaded here.

Identity (`AdapterIdentity`): the base LM's shape (hidden width, layers) and the adapter's type
and rank (LoKR: dim and factor). `adapter_identity` reads it from an exported adapter (its
tensors, metadata and training log), `adopt_identity` takes from a source run what the caller
left unset, and `check_identity` refuses a source of another base, type or rank (also when a
checkpoint is resumed: `lm_save.load_state`).

Warm start (`resolve_start`): `init_adapter="latest"` is the newest FINISHED run of the artist
on this LM size (`warm_start.latest_finished_run`, the DiT trainer's rule) of the adapter type
asked for, or of any type when none was (its type, rank and alpha are then adopted); with none
the run starts fresh. A start that cannot fit (`check_identity`) is refused before the weights
load, and the run logs one line naming what it starts from.

Separate from the setup because the Ray driver resolves the start before the job starts (a bad
one is refused there, not in a worker, and its identity sizes the memory plan); `setup_lm`
resolves it again where the weights load.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import export, lm_vram, warm_start
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.lm_spec import LmTrainSpec


# -- adapter identity (init_adapter) --------------------------------------------------------------
@dataclass(frozen=True)
class AdapterIdentity:
    """What must match to continue training an adapter: the base architecture and the shapes."""

    hidden: int
    layers: int
    kind: str
    rank: int
    factor: int = -1  # LoKR only
    size: str = ""

    def describe(self) -> str:
        shape = f"r{self.rank}" if self.kind == "lora" else f"dim {self.rank} factor {self.factor}"
        return f"{self.kind} {shape} on LM {self.size or '?'} ({self.hidden} wide, {self.layers} layers)"


def model_identity(dims: lm_vram.LmDims, spec: AdapterSpec, size: str) -> AdapterIdentity:
    factor = spec.factor if spec.kind == "lokr" else -1
    return AdapterIdentity(dims.hidden, dims.layers, spec.kind, spec.rank, factor, size)


def _layer_index(name: str) -> int | None:
    found = re.search(r"layers[._](\d+)[._]", name)
    return int(found.group(1)) if found else None


def adapter_identity(storage: Storage, key: str) -> tuple[AdapterIdentity, dict[str, Any]]:
    """Identity of an exported adapter folder (from its tensors, metadata and training log) and
    the source's log config ({} when there is no log)."""
    kind, tensors, meta = export.read_adapter_file(storage, key)
    log_key = f"{key}/{warm_start.LM_LOG_FILE}" if key else warm_start.LM_LOG_FILE
    log = storage.read_json(log_key) if storage.exists(log_key) else {}
    config = log.get("config", {}) if isinstance(log, dict) else {}
    layers = 1 + max((i for i in map(_layer_index, tensors) if i is not None), default=-1)
    q_keys = [k for k in tensors if "q_proj" in k and _layer_index(k) == 0]
    if kind == "lora":
        a = next(tensors[k] for k in q_keys if k.endswith("lora_A.weight"))
        rank, hidden, factor = int(a.shape[0]), int(a.shape[1]), -1
    else:
        lokr = json.loads(meta.get("lokr_config", "{}"))
        parts = {k.rsplit(".", 1)[1]: tensors[k] for k in q_keys}
        w1 = parts.get("lokr_w1", parts.get("lokr_w1_b"))
        w2 = parts.get("lokr_w2", parts.get("lokr_w2_b"))
        rank, factor = int(lokr.get("linear_dim", 0)), int(lokr.get("factor", -1))
        hidden = int(w1.shape[1] * w2.shape[1]) if w1 is not None and w2 is not None else 0
    size = str(config.get("lm_size", "")) or lm_vram.KNOWN_SIZES.get((hidden, layers), "")
    return AdapterIdentity(hidden, layers, kind, rank, factor, size), config


def adopt_identity(
    options: TrainLmOptions, source: AdapterIdentity, config: dict[str, Any]
) -> TrainLmOptions:
    """Identity fields the caller did not set are taken from the source run (seed behaviour);
    explicitly set ones are kept (and then checked)."""
    given = options.model_fields_set
    update: dict[str, Any] = {}
    if "adapter_type" not in given:
        update["adapter_type"] = source.kind
    kind = update.get("adapter_type", options.adapter_type)
    if kind == "lora" and source.kind == "lora":
        if "rank" not in given:
            update["rank"] = source.rank
        if "alpha" not in given and config.get("alpha"):
            update["alpha"] = float(config["alpha"])
    if kind == "lokr" and source.kind == "lokr":
        if "lokr_dim" not in given:
            update["lokr_dim"] = source.rank
        if "lokr_factor" not in given:
            update["lokr_factor"] = source.factor
        if "lokr_alpha" not in given and config.get("lokr_alpha") is not None:
            update["lokr_alpha"] = float(config["lokr_alpha"])
    if not update:
        return options
    merged = {**options.model_dump(exclude_unset=True), **update}
    return TrainLmOptions(**merged)


def check_identity(source: AdapterIdentity, target: AdapterIdentity, where: str) -> None:
    """Refuse to continue an adapter of another base size, adapter type or rank."""
    problems = []
    if (source.hidden, source.layers) != (target.hidden, target.layers):
        problems.append(f"base LM {source.size or '?'} vs {target.size or '?'}")
    if source.kind != target.kind:
        problems.append(f"adapter type {source.kind} vs {target.kind}")
    elif source.rank != target.rank:
        problems.append(f"rank {source.rank} vs {target.rank}")
    elif source.kind == "lokr" and source.factor != target.factor:
        problems.append(f"LoKR factor {source.factor} vs {target.factor}")
    if problems:
        raise InputError(
            f"cannot continue from {where}: it is a {source.describe()}, this run trains a "
            f"{target.describe()} ({'; '.join(problems)}). Match its settings, pick another "
            "adapter with --init-adapter, or pass --init-adapter '' to start from scratch"
        )


def resolve_init_adapter(
    storage: Storage, options: TrainLmOptions, base: str, artist: str, exclude: str = ""
) -> tuple[Storage, warm_start.TrainedRun] | None:
    """(storage, run) of the adapter to start from, or None for scratch. `latest` = the newest
    FINISHED run of this artist under this size (`warm_start.latest_finished_run`, the DiT
    trainer's rule too) of the adapter type asked for, or of any type when none was asked for
    (its identity is then adopted), other than `exclude`; anything else a storage key or local
    folder holding weights."""
    value = options.init_adapter
    if not value:
        return None
    if value == "latest":
        kind = options.adapter_type if "adapter_type" in options.model_fields_set else None
        found = warm_start.latest_finished_run(storage, base, artist, kind, exclude=exclude)
        return (storage, found) if found else None
    with contextlib.suppress(Exception):
        if (run := warm_start.trained_run(storage, value)) is not None:
            return storage, run
    local = Path(value)
    if local.is_dir() and (run := warm_start.trained_run(Storage(local), "")) is not None:
        return Storage(local), run
    raise InputError(f"--init-adapter {value!r}: no adapter weights there")


@dataclass(frozen=True)
class StartPoint:
    """Where a run's adapter starts (`resolve_start`)."""

    options: TrainLmOptions  # after identity adoption
    identity: AdapterIdentity  # what this run trains
    init: tuple[Storage, str] | None  # the adapter to load first; None = fresh
    init_from: dict[str, Any]  # what the log records of it ({} = fresh)
    line: str  # the one line naming what the run starts from


def resolve_start(
    spec: LmTrainSpec, storage: Storage, dims: lm_vram.LmDims, size: str
) -> StartPoint:
    """The warm start of `spec` on an LM of `dims`/`size` (no weights loaded): the adapter
    `init_adapter` resolves to, the options with its identity adopted where not given, checked
    (`check_identity`: an adapter of another type, rank or base is refused), and the line the
    run logs. Called by `setup_lm`, and by the Ray driver to refuse before the job starts."""
    options = spec.options
    base = layout.lm_adapter_base(size)
    found = resolve_init_adapter(storage, options, base, spec.artist, exclude=spec.run_key)
    if found is None:
        kind = options.adapter_type if "adapter_type" in options.model_fields_set else None
        line = (
            warm_start.fresh_start_line(base, spec.artist, kind)
            if options.init_adapter
            else "no warm start (init adapter ''): starting fresh"
        )
        identity = model_identity(dims, AdapterSpec.from_options(options), size)
        return StartPoint(options, identity, None, {}, line)
    source_storage, run = found
    init = (source_storage, run.key)
    source, source_config = adapter_identity(*init)
    options = adopt_identity(options, source, source_config)
    identity = model_identity(dims, AdapterSpec.from_options(options), size)
    url = source_storage.url_of(run.key)
    check_identity(source, identity, url)
    init_from = {"url": url, "identity": source.describe(), "loss": run.loss}
    line = f"{warm_start.warm_start_line(source_storage, run)} ({source.describe()})"
    return StartPoint(options, identity, init, init_from, line)
