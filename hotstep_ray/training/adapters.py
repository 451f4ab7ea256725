"""One adapter interface for LoRA and LoKR over any `nn.Module`; peft builds the layers.

The trainers only see parameters: `inject` wraps the target `nn.Linear`s in place (the model keeps
its class and forward signature), freezes everything else, and the functions below save, load,
scale, merge and measure the adapter.

Names. Every adapter tensor has a canonical key `<module path>.<suffix>` (peft's saved form
without the `base_model.model.` prefix and adapter name): `layers.0.self_attn.to_q.lora_A.weight`,
`layers.0.mlp.up_proj.lokr_w2`. Optimizer, checkpoint and export all use these keys.

LoKR is peft's `LoKrConfig`, held to LyCORIS's rules so the export loads in LyCORIS, ComfyUI and
ACE-Step and reproduces the same ΔW:
- factor shapes: `w1 [out_l, in_m]`, `w2 [out_k, in_n]` with `(l, k) = factorization(out, factor)`,
  `(m, n) = factorization(in, factor)`; `w1` is split into `w1_a @ w1_b` only with
  `decompose_both` and `dim < max(out_l, in_m) / 2`, `w2` into `w2_a @ w2_b` when
  `dim < max(out_k, in_n) / 2`.
- alpha: LyCORIS forces alpha = dim (scale 1) when both factors are full matrices; we pass that
  per module through peft's `alpha_pattern`, so the live scale and the exported `.alpha` agree.
- init: LyCORIS's (`w1` Kaiming, `w2` / `w2_b` zero), so an untrained adapter is exactly zero.
- forward: `KronLinear` runs one Linear on `W + scale · (w1 ⊗ w2)` with a backward that gives
  only the factors' gradients (`MergedKron`), or, where that does not apply, `x @ (w1 ⊗ w2)ᵀ`
  as two small GEMMs beside the base Linear (`kron_linear`); `training.speed.SpeedOptions` holds
  the choices between those paths.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from peft import LoKrConfig, LoraConfig, inject_adapter_in_model
from peft.tuners.lokr import LoKrModel
from peft.tuners.lokr.layer import Linear as PeftLoKrLinear
from peft.tuners.lokr.layer import factorization
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import BaseTunerLayer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from torch.nn import functional as F

from hotstep_ray.core.errors import InputError
from hotstep_ray.training import kron_kernels
from hotstep_ray.training.speed import SpeedOptions

ADAPTER_NAME = "default"  # peft's default; PeftModel.from_pretrained uses it too
DIT_ATTENTION_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # diffusers AceStep self+cross attn
LM_ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # Qwen3 / official ACE-Step names
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS = DIT_ATTENTION_TARGETS + MLP_TARGETS
# Block index of a module path: `layers.12.self_attn.to_q` -> 12 (also `blocks.N`, GPT-style `h.N`).
DEFAULT_LAYER_PATTERN = r"(?:^|\.)(?:layers|blocks|h)\.(\d+)(?:\.|$)"
_INFO_ATTR = "_hotstep_adapter"


class AdapterSpec(BaseModel):
    """What to train. `rank`/`alpha` are LoRA's r/lora_alpha or LoKR's dim/alpha (LyCORIS's
    `linear_dim`/`linear_alpha`); alpha 0 means "same as rank"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["lora", "lokr"] = "lora"
    rank: int = Field(default=16, ge=1)
    alpha: float = Field(default=32.0, ge=0)
    factor: int = -1  # LoKR: -1 = near-square split, else the small side of each factorization
    decompose_both: bool = False  # LoKR: also split w1 into w1_a @ w1_b when dim allows
    dropout: float = Field(default=0.0, ge=0, lt=1)  # LoRA input dropout; LoKR has none
    # Module-name suffixes (`to_q` matches `layers.3.self_attn.to_q`) or full module paths.
    targets: tuple[str, ...] = DEFAULT_TARGETS
    # Block indices to adapt (read from the path with `layer_pattern`), or a regex searched in
    # each module path; None = every block.
    layers_to_train: tuple[int, ...] | str | None = None
    layer_pattern: str = DEFAULT_LAYER_PATTERN
    # Adapter weights are kept in float32 (master weights) even on a bf16 base; BF16 is an
    # export format only. "base" keeps peft's choice (the base layer's dtype).
    adapter_dtype: Literal["float32", "base"] = "float32"

    @model_validator(mode="after")
    def _check(self) -> AdapterSpec:
        if self.factor != -1 and self.factor < 2:
            raise ValueError(f"LoKR factor must be -1 or >= 2, got {self.factor}")
        if self.kind == "lokr" and self.dropout:
            raise ValueError("LoKR has no input dropout (LyCORIS never implemented it); use 0")
        if not self.targets:
            raise ValueError("targets must name at least one module")
        return self

    @property
    def effective_alpha(self) -> float:
        return self.alpha or float(self.rank)

    @classmethod
    def from_options(cls, options: Any, targets: Sequence[str] | None = None) -> AdapterSpec:
        """Spec from `TrainDitOptions` / `TrainLmOptions` (duck-typed on their field names).
        Default targets: DiT attention (+ MLP when `target_mlp`), LM q/k/v/o + MLP."""
        is_lokr = options.adapter_type == "lokr"
        if targets is None:
            if hasattr(options, "target_mlp"):  # DiT
                targets = DIT_ATTENTION_TARGETS + (MLP_TARGETS if options.target_mlp else ())
            else:
                targets = LM_ATTENTION_TARGETS + MLP_TARGETS
        return cls(
            kind=options.adapter_type,
            rank=options.lokr_dim if is_lokr else options.rank,
            alpha=options.lokr_alpha if is_lokr else options.alpha,
            factor=options.lokr_factor if is_lokr else -1,
            decompose_both=options.lokr_decompose_both if is_lokr else False,
            targets=tuple(targets),
        )


@dataclass(frozen=True)
class InjectedAdapter:
    """Kept on the model after `inject`: the spec and the exact module paths adapted."""

    spec: AdapterSpec
    paths: tuple[str, ...]


# -- targeting -----------------------------------------------------------------------------------
def _matches(path: str, targets: Sequence[str]) -> bool:
    return any(path == t or path.endswith("." + t) for t in targets)


def _in_layers(path: str, spec: AdapterSpec) -> bool:
    if spec.layers_to_train is None:
        return True
    if isinstance(spec.layers_to_train, str):
        return re.search(spec.layers_to_train, path) is not None
    found = re.search(spec.layer_pattern, path)
    return found is not None and int(found.group(1)) in spec.layers_to_train


def resolve_targets(model: nn.Module, spec: AdapterSpec) -> list[str]:
    """Module paths `inject` will adapt, in `named_modules` order. Only `nn.Linear` is allowed
    (every DiT and LM projection is one); anything else matching is an error, not a skip."""
    paths = []
    for path, module in model.named_modules():
        if not path or not _matches(path, spec.targets) or not _in_layers(path, spec):
            continue
        if not isinstance(module, nn.Linear):
            raise InputError(f"adapter target {path!r} is a {type(module).__name__}, not Linear")
        paths.append(path)
    if not paths:
        raise InputError(
            f"no module matches targets {list(spec.targets)} "
            f"(layers_to_train={spec.layers_to_train!r})"
        )
    return paths


# -- LoKR: LyCORIS shape and alpha rules ---------------------------------------------------------
@dataclass(frozen=True)
class LokrShape:
    """Factor shapes of one Linear `[out, in]`: `w1 [out_l, in_m]`, `w2 [out_k, in_n]`."""

    out_l: int
    out_k: int
    in_m: int
    in_n: int
    w1_full: bool
    w2_full: bool


def lokr_shape(in_features: int, out_features: int, spec: AdapterSpec) -> LokrShape:
    in_m, in_n = factorization(in_features, spec.factor)
    out_l, out_k = factorization(out_features, spec.factor)
    # peft's factorization skips LyCORIS's final `m <= n` swap when `factor` divides the
    # dimension and exceeds its square root; the shapes would then differ from LyCORIS's.
    if in_m > in_n or out_l > out_k:
        raise InputError(
            f"LoKR factor {spec.factor} is larger than sqrt of a {out_features}x{in_features} "
            "layer; LyCORIS would transpose the factors. Use a smaller factor or -1."
        )
    w1_full = not (spec.decompose_both and spec.rank < max(out_l, in_m) / 2)
    w2_full = not spec.rank < max(out_k, in_n) / 2
    return LokrShape(out_l, out_k, in_m, in_n, w1_full, w2_full)


def lokr_alpha(shape: LokrShape, spec: AdapterSpec) -> float:
    """LyCORIS: alpha = dim (scale 1) when neither factor is low-rank, else the given alpha."""
    return float(spec.rank) if shape.w1_full and shape.w2_full else spec.effective_alpha


def kron_mix(x: torch.Tensor, mode: str = "auto") -> str:
    """The w1 mix `kron_linear` runs for input `x`: `mode` (`SpeedOptions.kron_mix`), with
    "auto" resolved by device ("ordered" on CUDA, "gemm" elsewhere)."""
    if mode != "auto":
        return mode
    return "ordered" if x.is_cuda else "gemm"


def mix_rows(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`y[..., i, :] = Σ_j w[i, j] · h[..., j, :]` for a tiny w `[a, c]` and h `[..., c, b]`, as
    c broadcast multiply-adds per row (no GEMM with K = c)."""
    a, c = w.shape
    rows = []
    for i in range(a):
        row = w[i, 0] * h[..., 0, :]
        for j in range(1, c):
            row = row + w[i, j] * h[..., j, :]
        rows.append(row)
    return torch.stack(rows, dim=-2)


class KronMix(torch.autograd.Function):
    """`mix_rows(h, w1)` with a backward that stays pointwise for h and gives w1's gradient by
    `w1_grad`."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, w1)
        return mix_rows(h, w1)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        h, w1 = ctx.saved_tensors
        a, c = w1.shape
        dh = mix_rows(dy, w1.t()) if ctx.needs_input_grad[0] else None
        dw1 = w1_grad(dy, h, a, c).to(w1.dtype) if ctx.needs_input_grad[1] else None
        return dh, dw1


def w1_grad(dy: torch.Tensor, h: torch.Tensor, a: int, c: int) -> torch.Tensor:
    """`[a, c]`: Σ over every token and column of dy[.., i, :] · h[.., j, :], for dy viewed
    `[tokens, a, b]` and h `[tokens, c, b]`, straight from the activations' own layout, summed in
    float32 (float64 stays float64). On CUDA in half precision with a, c <= 8: one Triton pass
    over both (`kron_kernels.pair_partials`), whose partials are summed here (compiled, in one
    kernel with the caller's scale and cast); elsewhere one [a, b] @ [b, c] per token, then the
    sum over tokens. One GEMM with K = tokens·b needs both operands copied into that layout first,
    and made the 2B LoKR step slower (`SpeedOptions.kron_mix`)."""
    b = h.shape[-1]
    x, y = dy.reshape(-1, a, b), h.reshape(-1, c, b)
    if kron_kernels.kernel_applies(x, y):
        return kron_kernels.pair_partials(x, y).sum(0)
    return kron_kernels.pair_sums_bmm(x, y)


def _merged_weight(
    weight: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scale: float
) -> torch.Tensor:
    """`weight + scale · (w1 ⊗ w2)`, the scale applied to the tiny w1, not the product."""
    return weight + torch.kron(w1 * scale, w2)


def _mix(h: torch.Tensor, w: torch.Tensor, mode: str) -> torch.Tensor:
    """`[..., a, n]` = w `[a, c]` applied over the c axis of h `[..., c, n]`: `mix_rows`'s
    pointwise multiply-adds where `kron_mix` picks a pointwise mix (CUDA), one broadcast matmul
    where it picks "gemm" (the CPU; also no a·c-op trace for a large w1)."""
    return torch.matmul(w, h) if kron_mix(h, mode) == "gemm" else mix_rows(h, w)


class MergedKron(torch.autograd.Function):
    """`F.linear(x, weight + scale · (w1 ⊗ w2), bias)` for a frozen `weight` `[a·b, c·d]`, with
    w1 `[a, c]`, w2 `[b, d]`, all in one dtype. Gradients for x, bias, w1 and w2; the merged
    weight is not saved for the backward, which builds it again (under torch.compile the
    partitioner may still choose to keep it: `dit_vram` charges one copy per layer).

    With dy viewed `[tokens, a, b]` and x `[tokens, c, d]`: dx = dy · W'; dw2 = scale ·
    Σ_t (w1ᵀ dy_t)ᵀ x_t, or Σ_t dy_tᵀ (w1 x_t) when a < c (the mix on the fewer row blocks);
    dw1[i, j] = scale · Σ over tokens and columns of dy_i · (x_j w2ᵀ), or of (dy_i w2) · x_j
    when a < c (the smaller GEMM). `mix` and `fused_mix`: the backward's `SpeedOptions`
    choices (`kron_mix`, `fused_mix`)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        w1: torch.Tensor,
        w2: torch.Tensor,
        scale: float,
        mix: str = "auto",
        fused_mix: bool = True,
    ) -> torch.Tensor:
        if weight.requires_grad:  # refused before any work: the backward has no dW
            raise NotImplementedError("MergedKron: the base weight must be frozen")
        ctx.save_for_backward(x, weight, w1, w2)
        ctx.scale, ctx.mix, ctx.fused_mix = scale, mix, fused_mix
        return F.linear(x, _merged_weight(weight, w1, w2, scale), bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, w1, w2 = ctx.saved_tensors
        scale, mix = ctx.scale, ctx.mix
        (a, c), (b, d) = w1.shape, w2.shape
        dx = dbias = dw1 = dw2 = None
        if ctx.needs_input_grad[0]:
            dx = dy @ _merged_weight(weight, w1, w2, scale)  # [..., c·d]
        if ctx.needs_input_grad[2]:
            dbias = dy.reshape(-1, a * b).sum(0)
        rows, cols = dy.reshape(-1, a, b), x.reshape(-1, c, d)
        need_w1, need_w2 = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        # The w1 mix goes on the side with fewer row blocks, and w1's pair sums use the GEMM
        # with w2 on the a-row side when a < c:
        #   a < c:  dw2 = Σ_t dy_tᵀ (w1 x_t)    [b, tokens·a] @ [tokens·a, d], mix x by w1;
        #           dw1 = pair sums of (dy_i w2, x_j)
        #   a >= c: dw2 = Σ_t (w1ᵀ dy_t)ᵀ x_t  [b, tokens·c] @ [tokens·c, d], mix dy by w1ᵀ;
        #           dw1 = pair sums of (dy_i, x_j w2ᵀ)
        mix_x = a < c
        mixed = None
        if need_w1:
            lhs, rhs = (rows @ w2, cols) if mix_x else (rows, cols @ w2.t())
            if need_w2 and fuses_mix(rows, cols, ctx.fused_mix):  # from the pair sums' pass
                m, side = (w1, 2) if mix_x else (w1.t(), 1)
                partials, mixed = kron_kernels.pair_partials_mix(lhs, rhs, m, side)
                dw1 = partials.sum(0)
            else:
                dw1 = w1_grad(lhs, rhs, a, c)
            dw1 = (dw1 * scale).to(w1.dtype)
        if need_w2:
            if mixed is None:
                mixed = _mix(cols, w1, mix) if mix_x else _mix(rows, w1.t(), mix)
            if mix_x:  # mixed [tokens, a, d]
                dw2 = (rows.reshape(-1, b).t() @ mixed.reshape(-1, d)) * scale
            else:  # mixed [tokens, c, b]
                dw2 = (mixed.reshape(-1, b).t() @ cols.reshape(-1, d)) * scale
        return dx, None, dbias, dw1, dw2, None, None, None


def fuses_mix(rows: torch.Tensor, cols: torch.Tensor, fused_mix: bool = True) -> bool:
    """Whether `MergedKron`'s backward takes w1's pair sums and w2's mix from one kernel pass
    (`kron_kernels.pair_partials_mix`) for dy's rows `[tokens, a, b]` and x's `[tokens, c, d]`:
    `fused_mix` (`SpeedOptions`) and the kernel's own conditions (the op still falls back to
    torch where its self-check fails)."""
    return fused_mix and kron_kernels.kernel_applies(rows, cols)


def kron_linear(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    scale: float = 1.0,
    mix: str = "auto",
) -> torch.Tensor:
    """`x @ (scale · w1 ⊗ w2)ᵀ` without building the `[a·b, c·d]` Kronecker product.

    x `[..., c·d]`, w1 `[a, c]`, w2 `[b, d]` or its factors `(w2_a [b, r], w2_b [r, d])`; `mix`
    the w1 mix (`SpeedOptions.kron_mix`).
    With X = x viewed `[..., c, d]`: (w1 ⊗ w2) x = vec(w1 · X · w2ᵀ), row-major. Each contraction
    keeps the 2-D weight on the right, so torch folds every leading axis into one GEMM.
    """
    a, c = w1.shape
    lead = x.shape[:-1]
    h = x.reshape(*lead, c, -1)  # [..., c, d]
    mix = kron_mix(x, mix)
    if mix == "ordered" and a <= c:  # (w1 · X) · w2ᵀ: the GEMM's output is [..., a, b]
        u = KronMix.apply(h, w1)  # [..., a, d]
        y = u @ w2[1].T @ w2[0].T if isinstance(w2, tuple) else u @ w2.T
        y = y.reshape(*lead, -1)
        return y * scale if scale != 1.0 else y
    if isinstance(w2, tuple):
        h = h @ w2[1].T @ w2[0].T  # [..., c, r] -> [..., c, b]
    else:
        h = h @ w2.T  # [..., c, b]
    b = h.shape[-1]
    if mix in ("pointwise", "ordered"):
        y = KronMix.apply(h, w1).reshape(*lead, a * b)  # [..., a, b] -> row index i·b + j
    else:
        y = h.transpose(-1, -2) @ w1.T  # [..., b, a]
        y = y.transpose(-1, -2).reshape(*lead, a * b)  # row index i·b + j
    return y * scale if scale != 1.0 else y


class KronLinear(PeftLoKrLinear):
    """peft's LoKr Linear with our forwards (`MergedKron`, or the factored `kron_linear`);
    merge/ΔW keep peft's materialised path. `speed` picks between them (`inject` and
    `set_speed` set it; the class default until then)."""

    speed: SpeedOptions = SpeedOptions()

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """peft's forward without its module-dropout coin. In training peft gates every adapter
        on `torch.rand(1) > module_dropout`, a Python branch on a tensor: torch.compile breaks
        the graph at every adapted Linear (20 graphs per tiny-DiT block, ~23 per 2B block: a
        host-bound step) and each call draws from the global RNG. With module_dropout 0 (always
        ours; LyCORIS has none) the coin says "apply" (bar rand == 0.0 exactly), so this is the
        same math as one straight-line graph. Disabled, merged or module-dropout layers keep
        peft's forward."""
        # Every LoKR adapter of this layer has a w1, whole or as its two factors: asking those
        # two dicts (not peft's `_available_adapters`, the union of all seven) keeps Dynamo's
        # guards on the other five out of every compiled block's cache lookup.
        active = [n for n in self.active_adapters if n in self.lokr_w1 or n in self.lokr_w1_a]
        if self.disable_adapters or self.merged or any(self.module_dropout[n] for n in active):
            return super().forward(x, *args, **kwargs)
        if len(active) == 1 and not args and not kwargs:
            merged = self._merged_forward(active[0], x)
            if merged is not None:
                return merged
        result = self.base_layer(x, *args, **kwargs)
        for name in active:
            result = result + self._get_delta_activations(name, x, *args, **kwargs)
        return result.to(x.dtype)

    def _get_delta_activations(
        self, adapter_name: str, input: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if self.training and self.rank_dropout[adapter_name]:
            return super()._get_delta_activations(adapter_name, input, *args, **kwargs)
        w1, w2 = self._factors(adapter_name)
        compute = autocast_dtype(input.device.type)
        if compute is not None:
            # Under autocast the GEMMs take `compute` operands anyway: keep the whole path there
            # (the w1 mix, what it saves for the backward) instead of float32 copies of every
            # adapted input (peft's rule); the factors are cast once per call, as autocast would
            # for a GEMM. That is both faster and smaller than float32 copies: a half-precision
            # copy is half the bytes to write, save and read back.
            x = input.to(compute)
            w1 = w1.to(compute)
            w2 = tuple(w.to(compute) for w in w2) if isinstance(w2, tuple) else w2.to(compute)
        else:
            x = self._cast_input_dtype(input, w1.dtype)
        return kron_linear(x, w1, w2, self.scaling[adapter_name], self.speed.kron_mix)

    def _factors(
        self, adapter_name: str
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        """w1 `[a, c]` and w2 `[b, d]` (or its low-rank pair) of one adapter."""
        if adapter_name in self.lokr_w1:
            w1 = self.lokr_w1[adapter_name]
        else:
            w1 = self.lokr_w1_a[adapter_name] @ self.lokr_w1_b[adapter_name]
        if adapter_name in self.lokr_w2:
            w2: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = self.lokr_w2[adapter_name]
        else:
            w2 = (self.lokr_w2_a[adapter_name], self.lokr_w2_b[adapter_name])
        return w1, w2

    def _merged_forward(self, adapter_name: str, x: torch.Tensor) -> torch.Tensor | None:
        """`MergedKron` (`speed.kron_forward` "merged") in the autocast dtype, or in the one
        dtype that x, the base weight and the factors share; None where it does not apply (rank
        dropout in training, a base that is not a frozen nn.Linear, mixed dtypes without
        autocast, fewer than `speed.kron_merged_min_tokens` rows of x)."""
        base = self.base_layer
        if (
            (self.training and self.rank_dropout[adapter_name])
            or type(base) is not nn.Linear
            or base.weight.requires_grad
            or not self.speed.kron_merges(math.prod(x.shape[:-1]))
        ):
            return None
        w1, w2 = self._factors(adapter_name)
        if isinstance(w2, tuple):
            w2 = w2[0] @ w2[1]
        compute = autocast_dtype(x.device.type)
        if compute is None:
            if not x.dtype == base.weight.dtype == w1.dtype == w2.dtype:
                return None
            compute = x.dtype
        bias = None if base.bias is None else base.bias.to(compute)
        with torch.autocast(x.device.type, enabled=False):  # every operand is `compute` already
            y = MergedKron.apply(
                x.to(compute),
                base.weight.to(compute),
                bias,
                w1.to(compute),
                w2.to(compute),
                self.scaling[adapter_name],
                self.speed.kron_mix,
                self.speed.fused_mix,
            )
        return y.to(x.dtype)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in effect for `device_type`, or None when autocast is off there."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class _KronLoKrModel(LoKrModel):
    """peft's LoKr tuner with `KronLinear` for Linear layers (peft's own extension point)."""

    layers_mapping = {**LoKrModel.layers_mapping, nn.Linear: KronLinear}


# -- inject --------------------------------------------------------------------------------------
# torch's global RNG is process state: peft draws the adapters' init from it, so two trainers
# of one process (make's in-process trainers, on threads) seed and inject one at a time, or one
# could draw from the other's seed.
_GLOBAL_RNG = threading.Lock()


def global_rng() -> threading.Lock:
    """Hold around a seeded use of torch's global RNG (`torch.manual_seed` + `inject`)."""
    return _GLOBAL_RNG


def inject(model: nn.Module, spec: AdapterSpec, speed: SpeedOptions | None = None) -> nn.Module:
    """Wrap the target Linears of `model` in place and freeze every other parameter; LoKR layers
    run with `speed` (default `SpeedOptions()`)."""
    if has_adapter(model) or any(True for _ in tuner_layers(model)):
        raise InputError("model already carries an adapter")
    paths = resolve_targets(model, spec)
    model.requires_grad_(False)
    if spec.kind == "lora":
        config = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.effective_alpha,
            lora_dropout=spec.dropout,
            target_modules=paths,
            bias="none",
            init_lora_weights=True,  # A Kaiming, B zero: ΔW = 0 at step 0
        )
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    else:
        alphas = {}
        for path in paths:
            layer = model.get_submodule(path)
            shape = lokr_shape(layer.in_features, layer.out_features, spec)
            alphas[re.escape(path)] = lokr_alpha(shape, spec)
        config = LoKrConfig(
            r=spec.rank,
            alpha=spec.effective_alpha,
            decompose_both=spec.decompose_both,
            decompose_factor=spec.factor,
            target_modules=paths,
            init_weights="lycoris",
            alpha_pattern=alphas,
        )
        _KronLoKrModel(model, config, adapter_name=ADAPTER_NAME)  # injects into `model` in place
    if spec.adapter_dtype == "float32":
        for param in adapter_parameters(model).values():
            param.data = param.data.float()
    if speed is not None:
        set_speed(model, speed)
    setattr(model, _INFO_ATTR, InjectedAdapter(spec=spec, paths=tuple(paths)))
    return model


def set_speed(model: nn.Module, speed: SpeedOptions) -> None:
    """Run every LoKR layer of `model` with `speed` (a compiled block recompiles on its next
    call: Dynamo guards the value). LoRA layers have no such choices."""
    for _, layer in tuner_layers(model):
        if isinstance(layer, KronLinear):
            layer.speed = speed


def has_adapter(model: nn.Module) -> bool:
    return getattr(model, _INFO_ATTR, None) is not None


def adapter_info(model: nn.Module) -> InjectedAdapter:
    info = getattr(model, _INFO_ATTR, None)
    if info is None:
        raise InputError("model has no adapter; call training.adapters.inject first")
    return info


def tuner_layers(model: nn.Module) -> Iterator[tuple[str, BaseTunerLayer]]:
    """(module path, peft layer) for every adapted module."""
    for path, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            yield path, module


def spec_scale(layer: BaseTunerLayer) -> float:
    """The adapter's trained scale α/r, ignoring any `set_scale` multiplier."""
    alpha = layer.lora_alpha if isinstance(layer, LoraLayer) else layer.alpha
    return float(alpha[ADAPTER_NAME]) / float(layer.r[ADAPTER_NAME])


# -- parameters and state ------------------------------------------------------------------------
def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Canonical key -> adapter parameter (trainable or not), in module order."""
    params: dict[str, nn.Parameter] = {}
    for path, layer in tuner_layers(model):
        for name, param in layer.named_parameters():
            parts = name.split(".")
            if parts[0] == "base_layer" or ADAPTER_NAME not in parts:
                continue
            params[f"{path}.{'.'.join(p for p in parts if p != ADAPTER_NAME)}"] = param
    return params


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(canonical key, parameter) of every parameter that trains: exactly the adapter's."""
    return [(key, p) for key, p in adapter_parameters(model).items() if p.requires_grad]


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the adapter tensors under canonical keys (their training dtype)."""
    return {key: p.detach().clone() for key, p in adapter_parameters(model).items()}


@torch.no_grad()
def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into the adapter; every key must exist with the same shape, and vice versa."""
    params = adapter_parameters(model)
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise InputError(
            f"adapter state does not fit the model: missing {missing[:5]} "
            f"({len(missing)}), unexpected {unexpected[:5]} ({len(unexpected)})"
        )
    for key, param in params.items():
        if tuple(state[key].shape) != tuple(param.shape):
            raise InputError(f"{key}: shape {tuple(state[key].shape)} != {tuple(param.shape)}")
        param.copy_(state[key].to(device=param.device, dtype=param.dtype))


# -- scale / enable / merge ----------------------------------------------------------------------
def set_scale(model: nn.Module, scale: float) -> None:
    """Multiply every module's α/r by `scale` (0 = base model); refused while merged."""
    for path, layer in tuner_layers(model):
        if layer.merged:
            raise InputError(f"{path} is merged; unmerge before changing the scale")
        layer.set_scale(ADAPTER_NAME, scale)


def set_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch the adapter off (exact base forward) or back on. peft also drops requires_grad on
    the adapter weights while disabled and restores it on enable."""
    for _, layer in tuner_layers(model):
        layer.enable_adapters(enabled)


def merge(model: nn.Module) -> None:
    """Fold ΔW into the base weights (inference speed); the adapter stays for `unmerge`."""
    for _, layer in tuner_layers(model):
        layer.merge(adapter_names=[ADAPTER_NAME])


def unmerge(model: nn.Module) -> None:
    for _, layer in tuner_layers(model):
        if layer.merged:
            layer.unmerge()


@torch.no_grad()
def delta_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Module path -> materialised ΔW `[out, in]` (float32, at the current scale)."""
    return {
        path: layer.get_delta_weight(ADAPTER_NAME).detach().float()
        for path, layer in tuner_layers(model)
    }


def base_weight(layer: BaseTunerLayer) -> torch.Tensor:
    """The frozen `[out, in]` weight under an adapter (includes ΔW while merged)."""
    return layer.get_base_layer().weight
