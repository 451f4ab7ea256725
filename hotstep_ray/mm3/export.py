"""MM3 LoRA gates and export: ||dW|| / ||W|| per group, and the ComfyUI file with the group filter.

Groups (the 8 trained sites, all 36 blocks): q, k, v, o (`attn.to_out.0`), ff_in, ff_out,
proj_in, proj_out.

Delta gate (seed trap 16): rel = ||(alpha/r) B A||_F / ||W||_F per module, reported as the median
and max of each group and the median over all modules, during training and at the end; a median
above 5 % (`training.export.DELTA_FLAG_RATIO`) is a damaged model, not a strong style, and warns.
The shared `training.export.delta_report` materialises every dW (about 12 GB of float32 on the
full DiT: ff_in alone is 36 x [16384, 2048]), so the norm here is the exact r x r form
||B A||_F^2 = sum((B^T B) * (A A^T)), and ||W||_F is computed once at setup.

ComfyUI file (HOT-Step / SimpleTuner `lora_format: comfyui` keys, prefix
`diffusion_model.diffusion_transformer.transformer.`):

    transformer_blocks.N.attn.to_q|to_k|to_v -> layers.N.self_attn.to_qkv   (fused, rows q|k|v)
    transformer_blocks.N.attn.to_out.0       -> layers.N.self_attn.to_out
    transformer_blocks.N.ff_in               -> layers.N.ff.ff.0.proj       (value|gate rows, as
                                                                             diffusers: no swap)
    transformer_blocks.N.ff_out              -> layers.N.ff.ff.2
    proj_in / proj_out                       -> project_in / project_out

each with `.lora_A.weight` [r, in], `.lora_B.weight` [out, r] and a 0-dim `.alpha`. The fused
qkv is block-diagonal: A = [A_q; A_k; A_v] [3r, 2048], B = diag(B_q, B_k, B_v) [6144, 3r], so
B A = [dW_q; dW_k; dW_v] exactly. The scale alpha/r is folded into B and every `.alpha` equals
its module's rank, so ComfyUI (alpha / rank), HOT-Step's loader (per-module alpha) and a loader
that ignores alpha all apply the trained delta at full strength. Float32, as HOT-Step exports.

Group filter (seed trap 18: filter at EXPORT, never at training): the default file zeroes the q
and k rows of every fused qkv (B rows 0-4095; the shared `zero_groups` zeroes A and B of q and
k) and DROPS project_in / project_out; `mm3_lora_unfiltered.safetensors` keeps everything for
ablations.
"""

from __future__ import annotations

import re
import statistics
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from hotstep_ray import __version__
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters
from hotstep_ray.training.export import (
    DELTA_FLAG_RATIO,
    TriggerPosition,
    split_key,
    trigger_metadata,
    zero_groups,
)

COMFY_PREFIX = "diffusion_model.diffusion_transformer.transformer."
MM3_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff_in", "ff_out", "proj_in", "proj_out")
GROUP_ORDER = ("q", "k", "v", "o", "ff_in", "ff_out", "proj_in", "proj_out")
FILTER_ZERO = ("q", "k")  # structure: zeroed in the export
FILTER_DROP = ("proj_in", "proj_out")  # seed-dependent fuzz: dropped from the export
QKV_SLOTS = {"to_q": 0, "to_k": 1, "to_v": 2}
_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.(.+)$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_BLOCK_NAMES = {
    "attn.to_out.0": "self_attn.to_out",
    "ff_in": "ff.ff.0.proj",
    "ff_out": "ff.ff.2",
}
_ROOT_NAMES = {"proj_in": "project_in", "proj_out": "project_out"}


def group_of(path: str) -> str:
    """Module path -> its group name (GROUP_ORDER)."""
    for name, group in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "o")):
        if path.endswith("." + name):
            return group
    return path.rsplit(".", 1)[-1]


# -- delta gate -----------------------------------------------------------------------------------
@torch.no_grad()
def base_norms(model: nn.Module) -> dict[str, float]:
    """||W||_F of every adapted module's frozen weight (call before training: unmerged)."""
    return {
        path: adapters.base_weight(layer).detach().float().norm().item()
        for path, layer in adapters.tuner_layers(model)
    }


@torch.no_grad()
def delta_norm(layer) -> float:
    """||(alpha/r) B A||_F of one LoRA layer via its r x r Gram matrices (no [out, in] product)."""
    a = layer.lora_A[adapters.ADAPTER_NAME].weight.detach().double()  # [r, in]
    b = layer.lora_B[adapters.ADAPTER_NAME].weight.detach().double()  # [out, r]
    squared = ((b.T @ b) * (a @ a.T)).sum().clamp(min=0.0)
    return adapters.spec_scale(layer) * squared.sqrt().item()


@dataclass(frozen=True)
class DeltaGate:
    groups: list[dict[str, Any]]  # {group, modules, median, max, flagged}
    median: float  # over every module
    threshold: float

    @property
    def flagged(self) -> bool:
        return self.median > self.threshold or any(g["flagged"] for g in self.groups)

    def summary(self) -> str:
        parts = [f"{g['group']} {100 * g['median']:.2f}%" for g in self.groups]
        return f"||dW||/||W|| median {100 * self.median:.2f}% ({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "threshold": self.threshold,
            "flagged": self.flagged,
            "groups": self.groups,
        }


def delta_gate(
    model: nn.Module, norms: Mapping[str, float], threshold: float = DELTA_FLAG_RATIO
) -> DeltaGate:
    """Per-group median/max of ||dW|| / ||W|| and a warning when a median exceeds `threshold`."""
    ratios: dict[str, list[float]] = {}
    every = []
    for path, layer in adapters.tuner_layers(model):
        ratio = delta_norm(layer) / max(norms[path], 1e-12)
        ratios.setdefault(group_of(path), []).append(ratio)
        every.append(ratio)
    groups = []
    for group in sorted(ratios, key=lambda g: (GROUP_ORDER + (g,)).index(g)):
        values = ratios[group]
        median = statistics.median(values)
        groups.append(
            {
                "group": group,
                "modules": len(values),
                "median": median,
                "max": max(values),
                "flagged": median > threshold,
            }
        )
    gate = DeltaGate(groups, statistics.median(every) if every else 0.0, threshold)
    if gate.flagged:
        warnings.warn(
            f"MM3 adapter moved the weights too far: {gate.summary()} exceeds the "
            f"{100 * threshold:.0f}% gate (healthy merges move 1-5%; lower lr or steps)",
            stacklevel=2,
        )
    return gate


# -- ComfyUI export -------------------------------------------------------------------------------
def comfy_module(path: str) -> tuple[str, int | None]:
    """Module path -> (ComfyUI module name without prefix, qkv slot or None)."""
    if path in _ROOT_NAMES:
        return _ROOT_NAMES[path], None
    match = _BLOCK.match(path)
    if match:
        index, rest = match.groups()
        if rest.startswith("attn.") and rest[5:] in QKV_SLOTS:
            return f"layers.{index}.self_attn.to_qkv", QKV_SLOTS[rest[5:]]
        if rest in _BLOCK_NAMES:
            return f"layers.{index}.{_BLOCK_NAMES[rest]}", None
    raise InputError(f"{path!r} is not an MM3 LoRA site")


def comfy_state(model: nn.Module, filtered: bool = True) -> dict[str, torch.Tensor]:
    """ComfyUI tensors (without the file prefix) of the model's LoRA, float32, scale folded."""
    state = adapters.adapter_state_dict(model)
    if filtered:
        state = zero_groups(state, FILTER_ZERO, group_of)
    scales = {path: adapters.spec_scale(layer) for path, layer in adapters.tuner_layers(model)}
    fused: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for path in scales:
        if filtered and group_of(path) in FILTER_DROP:
            continue
        a = state[f"{path}.lora_A.weight"].float().cpu()
        b = state[f"{path}.lora_B.weight"].float().cpu() * scales[path]
        name, slot = comfy_module(path)
        if slot is None:
            out[f"{name}.lora_A.weight"], out[f"{name}.lora_B.weight"] = a, b
            out[f"{name}.alpha"] = torch.tensor(float(a.shape[0]))
        else:
            fused.setdefault(name, {})[slot] = (a, b)
    for name, slots in fused.items():
        if sorted(slots) != [0, 1, 2]:
            raise InputError(f"{name}: q, k and v must all carry the adapter to fuse them")
        a_fused = torch.cat([slots[i][0] for i in range(3)])  # [3r, in]
        b_fused = torch.block_diag(*(slots[i][1] for i in range(3)))  # [3 out, 3r]
        out[f"{name}.lora_A.weight"], out[f"{name}.lora_B.weight"] = a_fused, b_fused
        out[f"{name}.alpha"] = torch.tensor(float(a_fused.shape[0]))
    return out


def export_comfy(
    model: nn.Module,
    storage: Storage,
    key: str,
    *,
    filtered: bool = True,
    trigger: str | None = None,
    trigger_position: TriggerPosition = "prepend",
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Write one ComfyUI-format MM3 LoRA file at `key`; returns the key."""
    spec = adapters.adapter_info(model).spec
    tensors = {COMFY_PREFIX + k: v.contiguous() for k, v in comfy_state(model, filtered).items()}
    meta = {
        "format": "pt",
        "hot_step_mm3_lora": "1",
        "rank": str(spec.rank),
        "alpha": str(spec.rank),  # alpha/r is folded into lora_B: the file's scale is 1
        "producer": f"hotstep-ray {__version__}",
        "hotstep_ray.lora_alpha": str(spec.effective_alpha),
        "hotstep_ray.lora_scale": "folded into lora_B",
        "hotstep_ray.group_filter": "q,k zeroed; proj_in,proj_out dropped" if filtered else "none",
        **trigger_metadata(trigger, trigger_position),
        **{str(k): str(v) for k, v in (metadata or {}).items()},
    }
    storage.write_bytes(key, save_safetensors(tensors, metadata=meta))
    return key


# -- ComfyUI import (audition, round trips) -----------------------------------------------------------
def _diffusers_paths(name: str) -> list[str]:
    """ComfyUI module name (no prefix) -> the diffusers module path(s) it covers."""
    for path, comfy in _ROOT_NAMES.items():
        if name == comfy:
            return [path]
    match = _LAYER.match(name)
    if not match:
        raise InputError(f"{name!r} is not an MM3 ComfyUI LoRA module")
    index, rest = match.groups()
    if rest == "self_attn.to_qkv":
        return [f"transformer_blocks.{index}.attn.{n}" for n in QKV_SLOTS]
    for diffusers_name, comfy in _BLOCK_NAMES.items():
        if rest == comfy:
            return [f"transformer_blocks.{index}.{diffusers_name}"]
    raise InputError(f"{name!r} is not an MM3 ComfyUI LoRA module")


def _split_fused(a: torch.Tensor, b: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fused qkv -> [(A, B)] for q, k, v: block-diagonal (rank 3r) or shared-A (HOT-Step's
    training form: A [r, in], B [3 out, r])."""
    out = b.shape[0] // 3
    rows = [slice(i * out, (i + 1) * out) for i in range(3)]
    if a.shape[0] % 3 == 0:
        r = a.shape[0] // 3
        blocks = [(a[i * r : (i + 1) * r], b[rows[i], i * r : (i + 1) * r]) for i in range(3)]
        rebuilt = torch.block_diag(*(blk for _, blk in blocks))
        if torch.equal(rebuilt, b):
            return blocks
    return [(a, b[rows[i]]) for i in range(3)]


def load_comfy(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load a ComfyUI MM3 LoRA into a model carrying a LoRA of the same rank on every site the
    file names (modules the file lacks, e.g. dropped proj_in/out, are set to zero)."""
    layers = dict(adapters.tuner_layers(model))
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, suffix = split_key(key.removeprefix(COMFY_PREFIX))
        modules.setdefault(module, {})[suffix] = tensor.float()
    state = {k: torch.zeros_like(v) for k, v in adapters.adapter_state_dict(model).items()}
    for name, parts in modules.items():
        a, b = parts["lora_A.weight"], parts["lora_B.weight"]
        file_scale = float(parts.get("alpha", torch.tensor(float(a.shape[0])))) / a.shape[0]
        paths = _diffusers_paths(name)
        pairs = _split_fused(a, b) if len(paths) == 3 else [(a, b)]
        for path, (a_i, b_i) in zip(paths, pairs, strict=True):
            if path not in layers:
                raise InputError(f"{path}: the model has no adapter there")
            live = adapters.spec_scale(layers[path])
            state[f"{path}.lora_A.weight"] = a_i
            state[f"{path}.lora_B.weight"] = b_i * (file_scale / live)
    adapters.load_adapter_state(model, state)
