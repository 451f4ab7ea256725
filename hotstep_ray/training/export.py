"""Adapter files other tools load: writers, readers, trigger metadata, delta report.

LoRA -> a PEFT folder: `adapter_config.json` (written first) + `adapter_model.safetensors`, BF16,
keys `base_model.model.<module path>.lora_A.weight` `[r, in]` / `.lora_B.weight` `[out, r]`.
The scale α/r is FOLDED into lora_B and the config says `lora_alpha = r`, with no `.alpha` keys.
Why: the three consumers disagree on where alpha lives —
- peft `PeftModel.from_pretrained` (ACE-Step's own loader) reads `lora_alpha` from the config;
- diffusers `AceStepLoraLoaderMixin.load_lora_weights` ignores adapter_config.json and, without a
  `lora_adapter_metadata` entry or `network_alphas`, builds `LoraConfig(lora_alpha=r)`
  (`utils/peft_utils.get_peft_kwargs`), so an r64/α128 file loads at half strength; it also
  rejects any key without "lora" in it, so a `.alpha` tensor would make it refuse the file;
- ComfyUI (`comfy/weight_adapter/lora.py`) scales by `<prefix>.alpha / rank` when that key exists
  and by 1.0 otherwise; its ACEStep15 map (`comfy/lora.py`) accepts
  `base_model.model.<path>` -> `diffusion_model.decoder.<path>.weight`.
With ΔW = B'·A and scale 1 every one of them applies the trained ΔW at full strength. The original
α and r are kept in `__metadata__` (`hotstep_ray.lora_alpha`, `hotstep_ray.lora_rank`).

LoKR -> `lokr_weights.safetensors` only (LyCORIS `save_weights` layout), BF16, keys
`lycoris_<module path with . -> _>.{lokr_w1 | lokr_w1_a, lokr_w1_b, lokr_w2 | lokr_w2_a, lokr_w2_b}`
plus a 0-dim `.alpha` per module; `__metadata__` carries `format: lycoris`, `algo: lokr` and a
`lokr_config` JSON string. LyCORIS, ComfyUI (`lycoris_<path>` map, PR #12665) and ACE-Step read it.
diffusers' `AceStepLoraLoaderMixin.load_lora_weights` cannot: it has no LoKr conversion and
refuses any key without "lora"; a diffusers pipeline takes a LoKR through LyCORIS on
`pipe.transformer` (the `diffusers_names` copy below).

Module names. Module-level loaders match keys to the module tree they are handed: peft's
`PeftModel.from_pretrained` wraps the config's `target_modules` and fills them from
`base_model.model.<path>` keys; LyCORIS's `create_lycoris_from_weights` / `load_weights` take a
`lycoris_<path with _>` key only when the given model has that module, and skip every other key
without a word. The DiT has two trees: diffusers' `AceStepTransformer1DModel` (what this project
trains and loads: `layers.N.self_attn.to_q` … `to_out.0`) and the official decoder
(`AceStepConditionGenerationModel.decoder`, which ACE-Step, Side-Step and ComfyUI's ACEStep15
map load onto: `q_proj` … `o_proj`); MLP names are shared. No single name set loads fully in
both: a file under one tree's names loads only the MLP modules into the other. So with
`rename` (the DiT passes `ACESTEP_OFFICIAL_NAMES`) and `model_names_dir` the export writes
- at `<key>/`: the official names, what ACE-Step/Side-Step/ComfyUI read; diffusers'
  `AceStepLoraLoaderMixin.load_lora_weights` converts `q_proj` -> `to_q` itself, so a diffusers
  pipeline takes this LoRA folder too;
- at `<key>/<model_names_dir>/` (`DIFFUSERS_NAMES_DIR`): the same tensors and metadata under the
  trained model's own names, for peft and LyCORIS applied to the diffusers transformer. Never
  give this copy to `load_lora_weights`: without `q_proj` keys diffusers does not convert, and its
  `transformer.` prefix filter then drops every key.
The LM (Qwen3) already uses its model's names (`q_proj`) and passes no rename: one folder.
Readers of our own (`load_exported`) read the primary with the same `rename`.
docs/ADAPTERS.md lists the exact load call per loader.

Triggers go into `__metadata__` only (`hot_step_trigger`, `hot_step_trigger_position`,
`modelspec.trigger_phrase`; none for `replace`), never into adapter_config.json, which peft feeds
to `LoraConfig(**json)`.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import torch
from peft import LoraConfig
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import nn

from hotstep_ray import __version__
from hotstep_ray.core import layout, safetensors_header
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters
from hotstep_ray.training.adapters import AdapterSpec

LORA_CONFIG_FILE = "adapter_config.json"
LORA_WEIGHTS_FILE = "adapter_model.safetensors"
LOKR_WEIGHTS_FILE = "lokr_weights.safetensors"
PEFT_PREFIX = "base_model.model."
LYCORIS_PREFIX = "lycoris_"
PRODUCER = f"hotstep-ray {__version__}"
EXPORT_DTYPE = torch.bfloat16
# diffusers AceStepTransformer1DModel module names -> official ACE-Step 1.5 decoder names
# (the same table as `models/acestep_keys.py`, for Linear modules only).
ACESTEP_OFFICIAL_NAMES: dict[str, str] = {
    "to_q": "q_proj",
    "to_k": "k_proj",
    "to_v": "v_proj",
    "to_out.0": "o_proj",
}
# Where a DiT export keeps its copy under diffusers' module names (`model_names_dir`).
DIFFUSERS_NAMES_DIR = layout.DIFFUSERS_NAMES_DIR
TriggerPosition = Literal["prepend", "append", "replace"]
DELTA_FLAG_RATIO = 0.05  # healthy merges move weights 1-5 % Frobenius (seed trap #16)

# -- names ---------------------------------------------------------------------------------------
_KINDS = {
    "to_q": "q",
    "q_proj": "q",
    "to_k": "k",
    "k_proj": "k",
    "to_v": "v",
    "v_proj": "v",
    "to_out.0": "o",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}
_KIND_ORDER = ("q", "k", "v", "o", "gate", "up", "down")


def rename_path(path: str, renames: Mapping[str, str] | None) -> str:
    """Replace whole dotted name runs: `layers.0.self_attn.to_out.0` -> `....o_proj`."""
    for old, new in (renames or {}).items():
        path = re.sub(rf"(?<![^.]){re.escape(old)}(?![^.])", new, path)
    return path


def inverse(renames: Mapping[str, str] | None) -> dict[str, str]:
    return {new: old for old, new in (renames or {}).items()}


def split_key(key: str) -> tuple[str, str]:
    """Canonical key -> (module path, suffix): `a.b.lora_A.weight` -> (`a.b`, `lora_A.weight`)."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("lora_", "lokr_")) or (part == "alpha" and i == len(parts) - 1):
            return ".".join(parts[:i]), ".".join(parts[i:])
    raise InputError(f"not an adapter key: {key!r}")


def lycoris_name(path: str) -> str:
    return LYCORIS_PREFIX + path.replace(".", "_")


def projection_kind(path: str) -> str:
    """Group of a module path: q, k, v, o, gate, up, down, or its last name."""
    for name, kind in _KINDS.items():
        if path == name or path.endswith("." + name):
            return kind
    return path.rsplit(".", 1)[-1]


# -- trigger -------------------------------------------------------------------------------------
def trigger_metadata(trigger: str | None, position: TriggerPosition = "prepend") -> dict[str, str]:
    """The trigger triple for `__metadata__`; empty for no trigger and for `replace` (that mode
    never puts the tag in the caption, so there is nothing to trigger)."""
    if position not in ("prepend", "append", "replace"):
        raise InputError(f"trigger position must be prepend, append or replace, got {position!r}")
    if not trigger or position == "replace":
        return {}
    return {
        "hot_step_trigger": trigger,
        "hot_step_trigger_position": position,
        "modelspec.trigger_phrase": trigger,
    }


# -- groups and delta report ---------------------------------------------------------------------
def zero_groups(
    state: Mapping[str, torch.Tensor],
    groups: Iterable[str],
    group_of: Callable[[str], str] = projection_kind,
) -> dict[str, torch.Tensor]:
    """Copy of a canonical adapter state with every tensor of the chosen groups zeroed, so their
    ΔW is exactly 0 while shapes and configs stay valid for every loader ("filter groups at
    export, never at training": seed trap #18). `.alpha` scalars are kept."""
    drop = set(groups)
    out = {}
    for key, tensor in state.items():
        path, suffix = split_key(key)
        zero = group_of(path) in drop and suffix != "alpha"
        out[key] = torch.zeros_like(tensor) if zero else tensor
    return out


@torch.no_grad()
def delta_report(
    model: nn.Module,
    threshold: float = DELTA_FLAG_RATIO,
    group_of: Callable[[str], str] = projection_kind,
) -> list[dict[str, Any]]:
    """Per projection group: median and max of ‖ΔW‖_F / ‖W‖_F over its modules, flagged when the
    median exceeds `threshold` (5 %: past that a merge damages the model rather than styling it)."""
    ratios: dict[str, list[float]] = {}
    deltas = adapters.delta_weights(model)
    for path, layer in adapters.tuner_layers(model):
        if layer.merged:
            raise InputError("delta_report needs the unmerged model")
        weight = adapters.base_weight(layer).detach().float()
        ratio = (deltas[path].norm() / weight.norm().clamp(min=1e-12)).item()
        ratios.setdefault(group_of(path), []).append(ratio)

    def order(group: str) -> tuple[int, str]:
        return (_KIND_ORDER.index(group) if group in _KIND_ORDER else len(_KIND_ORDER), group)

    report = []
    for group in sorted(ratios, key=order):
        values = ratios[group]
        median = statistics.median(values)
        report.append(
            {
                "group": group,
                "modules": len(values),
                "median": median,
                "max": max(values),
                "flagged": median > threshold,
            }
        )
    return report


# -- writers -------------------------------------------------------------------------------------
def _storage(dest: Storage | str | os.PathLike[str]) -> Storage:
    return dest if isinstance(dest, Storage) else Storage(dest)


def _join(key: str, name: str) -> str:
    return f"{key.rstrip('/')}/{name}" if key else name


def _metadata(base: dict[str, str], trigger: str | None, position: str, extra: Mapping | None):
    meta = {**base, **trigger_metadata(trigger, position)}  # type: ignore[arg-type]
    meta.update({str(k): str(v) for k, v in (extra or {}).items()})
    return meta


def _renames_any(paths: Iterable[str], rename: Mapping[str, str] | None) -> bool:
    return any(rename_path(path, rename) != path for path in paths)


def export_lora(
    model: nn.Module,
    dest: Storage | str | os.PathLike[str],
    key: str = "",
    *,
    rename: Mapping[str, str] | None = None,
    model_names_dir: str = "",
    trigger: str | None = None,
    trigger_position: TriggerPosition = "prepend",
    drop_groups: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    base_model_name_or_path: str = "",
) -> list[str]:
    """Write the PEFT LoRA folder at `key`; returns the written storage keys. With a `rename`
    that changes a module name and a `model_names_dir`, the same folder under the model's own
    module names is written first at `<key>/<model_names_dir>` (see the module docstring)."""
    info = adapters.adapter_info(model)
    if info.spec.kind != "lora":
        raise InputError("export_lora needs a LoRA adapter")
    state = zero_groups(adapters.adapter_state_dict(model), drop_groups)
    scales = {path: adapters.spec_scale(layer) for path, layer in adapters.tuner_layers(model)}
    spec = info.spec
    meta = _metadata(
        {
            "format": "pt",
            "producer": PRODUCER,
            "hotstep_ray.lora_rank": str(spec.rank),
            "hotstep_ray.lora_alpha": str(spec.effective_alpha),
            "hotstep_ray.lora_scale": "folded into lora_B",
        },
        trigger,
        trigger_position,
        metadata,
    )
    storage = _storage(dest)

    def write(folder: str, names: Mapping[str, str] | None) -> list[str]:
        tensors = {}
        for canonical, tensor in state.items():
            path, suffix = split_key(canonical)
            if suffix == "lora_B.weight":
                tensor = tensor.float() * scales[path]  # fold α/r in float32, then round once
            tensors[f"{PEFT_PREFIX}{rename_path(path, names)}.{suffix}"] = tensor
        tensors = {k: v.to(EXPORT_DTYPE).contiguous().cpu() for k, v in tensors.items()}
        config = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.rank,  # α/r is folded into lora_B
            lora_dropout=spec.dropout,
            target_modules=[rename_path(p, names) for p in info.paths],
            bias="none",
            base_model_name_or_path=base_model_name_or_path or None,
            inference_mode=True,
        ).to_dict()
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        config_key, weights_key = _join(folder, LORA_CONFIG_FILE), _join(folder, LORA_WEIGHTS_FILE)
        # Config first: a reader that finds weights can always find their config.
        storage.write_text(config_key, json.dumps(config, indent=2, sort_keys=True) + "\n")
        storage.write_bytes(weights_key, save_safetensors_bytes(tensors, metadata=meta))
        return [config_key, weights_key]

    written = []
    if model_names_dir and _renames_any(info.paths, rename):
        # Before the primary: a reader that finds the primary finds this copy too.
        written += write(_join(key, model_names_dir), None)
    return written + write(key, rename)


def lokr_config(
    spec: AdapterSpec, rename: Mapping[str, str] | None = None, extra: Mapping | None = None
):
    """LyCORIS `LoKRConfigV2`-style dict for `__metadata__["lokr_config"]`."""
    return {
        "linear_dim": spec.rank,
        "linear_alpha": spec.effective_alpha,
        "factor": spec.factor,
        "decompose_both": spec.decompose_both,
        "use_tucker": False,
        "use_scalar": False,
        "weight_decompose": False,
        "full_matrix": False,
        "bypass_mode": False,
        "rs_lora": False,
        "unbalanced_factorization": False,
        "target_modules": [rename_path(t, rename) for t in spec.targets],
        **(extra or {}),
    }


def export_lokr(
    model: nn.Module,
    dest: Storage | str | os.PathLike[str],
    key: str = "",
    *,
    rename: Mapping[str, str] | None = None,
    model_names_dir: str = "",
    trigger: str | None = None,
    trigger_position: TriggerPosition = "prepend",
    drop_groups: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """Write `lokr_weights.safetensors` at `key`; returns the written storage keys. With a
    `rename` that changes a module name and a `model_names_dir`, the same file under the model's
    own module names is written first at `<key>/<model_names_dir>/` (see the module docstring)."""
    info = adapters.adapter_info(model)
    if info.spec.kind != "lokr":
        raise InputError("export_lokr needs a LoKR adapter")
    state = zero_groups(adapters.adapter_state_dict(model), drop_groups)
    alphas: dict[str, torch.Tensor] = {}
    for path, layer in adapters.tuner_layers(model):
        alpha = float(layer.alpha[adapters.ADAPTER_NAME])
        stored = torch.tensor(alpha, dtype=EXPORT_DTYPE)
        low_rank = not (
            adapters.ADAPTER_NAME in layer.lokr_w1 and adapters.ADAPTER_NAME in layer.lokr_w2
        )
        if low_rank and stored.item() != alpha:  # full factors ignore alpha (scale 1)
            warnings.warn(
                f"{path}: alpha {alpha} is not BF16-exact; the exported scale rounds to "
                f"{stored.item()}",
                stacklevel=2,
            )
        alphas[path] = stored
    storage = _storage(dest)

    def write(folder: str, names: Mapping[str, str] | None) -> list[str]:
        tensors: dict[str, torch.Tensor] = {}
        for canonical, tensor in state.items():
            path, suffix = split_key(canonical)
            tensors[f"{lycoris_name(rename_path(path, names))}.{suffix}"] = tensor
        for path, stored in alphas.items():
            tensors[f"{lycoris_name(rename_path(path, names))}.alpha"] = stored
        tensors = {k: v.to(EXPORT_DTYPE).contiguous().cpu() for k, v in tensors.items()}
        meta = _metadata(
            {
                "format": "lycoris",
                "algo": "lokr",
                "producer": PRODUCER,
                "lokr_config": json.dumps(lokr_config(info.spec, names, extra_config)),
            },
            trigger,
            trigger_position,
            metadata,
        )
        weights_key = _join(folder, LOKR_WEIGHTS_FILE)
        storage.write_bytes(weights_key, save_safetensors_bytes(tensors, metadata=meta))
        return [weights_key]

    written = []
    if model_names_dir and _renames_any(info.paths, rename):
        # Before the primary: a reader that finds the primary finds this copy too.
        written += write(_join(key, model_names_dir), None)
    return written + write(key, rename)


def export_adapter(
    model: nn.Module, dest: Storage | str | os.PathLike[str], key: str = "", **kwargs: Any
) -> list[str]:
    """`export_lora` or `export_lokr`, by the injected adapter's kind."""
    if adapters.adapter_info(model).spec.kind == "lora":
        return export_lora(model, dest, key, **kwargs)
    kwargs.pop("base_model_name_or_path", None)
    return export_lokr(model, dest, key, **kwargs)


# -- readers -------------------------------------------------------------------------------------
def read_adapter_file(
    src: Storage | str | os.PathLike[str], key: str = ""
) -> tuple[str, dict[str, torch.Tensor], dict[str, str]]:
    """(kind, tensors, metadata) of the adapter folder at `key`."""
    storage = _storage(src)
    for kind, name in (("lora", LORA_WEIGHTS_FILE), ("lokr", LOKR_WEIGHTS_FILE)):
        if storage.exists(_join(key, name)):
            data = storage.read_bytes(_join(key, name))
            return kind, load_safetensors_bytes(data), safetensors_header.metadata_of(data)
    raise InputError(f"no {LORA_WEIGHTS_FILE} or {LOKR_WEIGHTS_FILE} at {storage.url_of(key)}")


def read_trigger(src: Storage | str | os.PathLike[str], key: str = "") -> dict[str, str]:
    """The embedded trigger triple ({} when none)."""
    _, _, meta = read_adapter_file(src, key)
    names = ("hot_step_trigger", "hot_step_trigger_position", "modelspec.trigger_phrase")
    return {k: meta[k] for k in names if k in meta}


def _lora_state(
    tensors: dict[str, torch.Tensor], config: dict[str, Any] | None, renames: dict[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Canonical LoRA state and each module's file scale (ComfyUI `.alpha`, else the PEFT config's
    lora_alpha / r, else 1 — the diffusers reading)."""
    state, alphas = {}, {}
    for file_key, tensor in tensors.items():
        name = file_key.removeprefix(PEFT_PREFIX)
        path, suffix = split_key(name)
        path = rename_path(path, renames)
        if suffix == "alpha":
            alphas[path] = float(tensor)
        else:
            state[f"{path}.{suffix}"] = tensor
    scales = {}
    for canonical, tensor in state.items():
        path, suffix = split_key(canonical)
        if suffix != "lora_A.weight":
            continue
        rank = tensor.shape[0]
        if path in alphas:
            scales[path] = alphas[path] / rank
        elif config is not None:
            scales[path] = float(config.get("lora_alpha", rank)) / float(config.get("r", rank))
        else:
            scales[path] = 1.0
    return state, scales


def _lokr_file_scale(factors: dict[str, torch.Tensor], alpha: float | None) -> float:
    """LyCORIS/ComfyUI: full w1 and w2 -> 1; otherwise alpha / dim of the low-rank factor."""
    if "lokr_w1" in factors and "lokr_w2" in factors:
        return 1.0
    dim = factors["lokr_w1_b"].shape[0] if "lokr_w1_b" in factors else factors["lokr_w2_b"].shape[0]
    return (alpha if alpha else dim) / dim


def _lora_live_state(
    model: nn.Module,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any] | None,
    rename: Mapping[str, str] | None,
) -> dict[str, torch.Tensor]:
    state, file_scales = _lora_state(tensors, config, inverse(rename))
    if not adapters.has_adapter(model):
        rank = next(t.shape[0] for k, t in state.items() if k.endswith("lora_A.weight"))
        paths = tuple(sorted(file_scales))
        adapters.inject(model, AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=paths))
    layers = dict(adapters.tuner_layers(model))
    unknown = sorted(set(file_scales) - set(layers))
    if unknown:
        raise InputError(f"{unknown[:3]}: the model has no adapted module of these names")
    for path, file_scale in file_scales.items():
        ratio = file_scale / adapters.spec_scale(layers[path])
        if not math.isclose(ratio, 1.0):
            state[f"{path}.lora_B.weight"] = state[f"{path}.lora_B.weight"].float() * ratio
    return state


def _lokr_live_state(
    model: nn.Module,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, str],
    rename: Mapping[str, str] | None,
) -> dict[str, torch.Tensor]:
    stems = {k.split(".", 1)[0] for k in tensors}
    if not adapters.has_adapter(model):
        if "lokr_config" not in meta:
            raise InputError("LoKR file has no lokr_config metadata; inject the adapter first")
        config = json.loads(meta["lokr_config"])
        names = {lycoris_name(rename_path(p, rename)): p for p, _ in model.named_modules()}
        unknown = sorted(stems - set(names))
        if unknown:
            raise InputError(f"{unknown[:3]}: no module of the model has these names")
        spec = AdapterSpec(
            kind="lokr",
            rank=int(config["linear_dim"]),
            alpha=float(config.get("linear_alpha", 0)),
            factor=int(config.get("factor", -1)),
            decompose_both=bool(config.get("decompose_both", False)),
            targets=tuple(sorted(names[stem] for stem in stems)),
        )
        adapters.inject(model, spec)
    layers = dict(adapters.tuner_layers(model))
    by_name = {lycoris_name(rename_path(p, rename)): p for p in layers}
    unknown = sorted(stems - set(by_name))
    if unknown:
        raise InputError(f"{unknown[:3]}: the model has no adapted module of these names")
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for file_key, tensor in tensors.items():
        stem, suffix = file_key.split(".", 1)
        grouped.setdefault(by_name[stem], {})[suffix] = tensor
    state = {}
    for path, factors in grouped.items():
        alpha = factors.pop("alpha", None)
        file_scale = _lokr_file_scale(factors, None if alpha is None else float(alpha))
        ratio = file_scale / adapters.spec_scale(layers[path])
        for suffix, tensor in factors.items():
            if not math.isclose(ratio, 1.0) and suffix in ("lokr_w2", "lokr_w2_b"):
                tensor = tensor.float() * ratio  # scale lives in the (low-rank) w2 side
            state[f"{path}.{suffix}"] = tensor
    return state


def load_exported(
    model: nn.Module,
    src: Storage | str | os.PathLike[str],
    key: str = "",
    *,
    rename: Mapping[str, str] | None = None,
) -> nn.Module:
    """Load an exported adapter folder into `model` (injecting it first when the model has no
    adapter). `rename` is the table the export used. ΔW is reproduced up to BF16 rounding: each
    module's file scale is converted into the live layer's α/r."""
    storage = _storage(src)
    kind, tensors, meta = read_adapter_file(storage, key)
    if kind == "lora":
        config_key = _join(key, LORA_CONFIG_FILE)
        config = storage.read_json(config_key) if storage.exists(config_key) else None
        state = _lora_live_state(model, tensors, config, rename)
    else:
        state = _lokr_live_state(model, tensors, meta, rename)
    adapters.load_adapter_state(model, state)
    return model
