"""Hybrid Muon: orthogonalised momentum for 2-D weights, AdamW for everything else.

Per parameter, not global: a 2-D tensor whose short side is >= `muon_min_dim` (16) goes to Muon;
vectors, scalars and thin matrices (a LoKR `w1 [4, 5]`, a rank-8 LoRA `A [8, in]`) go to AdamW,
because orthogonalising a <16-dimensional subspace is vacuous. LoKR 512 (factor 6) splits
264 Muon / 264 AdamW on the 2B DiT and 448 / 352 on XL.

Learning rate. Muon's update is orthonormal (RMS ≈ 1/sqrt(max side)), about 20× smaller per
element than AdamW's, so Muon groups run at `lr × muon_lr_scale` (20: 5 undershoots, 50
overshoots on the DiT). The LR schedule multiplies every group's `base_lr`, so both follow the
same shape. Weight decay is divided by the same scale, so the decoupled decay per step
(`lr · wd`) is AdamW's: the scale compensates the update's size, not the decay.

Shape adjustment: torch's `adjust_lr_fn="original"` (Keller Jordan's reference, torch's default):
lr × sqrt(max(1, rows / cols)). LoKR factors are near-square (ratio ≈ 1), so HOT-Step's ×20
calibration carries over; a LoRA `B [out, r]` gets its sqrt(out / r) boost as in every published
Muon. `"match_rms_adamw"` (Moonshot: 0.2·sqrt(max side)) would stack on the ×20 and overshoot.

Precision (`ns_precision`). torch 2.13's Muon casts the Newton–Schulz iteration to bfloat16;
"bfloat16" reproduces its step bit for bit. "float32" is IEEE float32. "tf32" keeps float32
tensors and runs the GEMMs on TF32 tensor cores (CUDA only; on the CPU it is "float32" exactly).
A LoKR 512 adapter on the 2B DiT stacks 264 factors of 256-1024 a side, ~0.95 TFLOP of
Newton–Schulz per step, so the precision is also a speed choice. Five quintic steps only bring
the singular values into (0.5, 1.5) anyway, so even bfloat16's rounding is inside what Muon
tolerates (each mode's time and deviation from float64: docs/BENCHMARKS.md, row `muon`;
bench/muon_bench.py).

"bfloat16_batched", the CUDA default ("auto"), is the bucketed step in bfloat16: the precision of
torch's Muon and of the Muon reference, at twice TF32's tensor-core rate, and the fastest mode at
an error within Muon's own tolerance (row `muon`). LoKR's 512-wide square w2 factors carry ~9x
the Newton–Schulz arithmetic of LoRA r64's rank-64 ones (0.95 against 0.106 TFLOP a step), so
LoKR's update is where the precision shows. The LM trainers' "auto" is the same choice, made on
the DiT's shapes.

Bucketing. LoRA/LoKR adapters give hundreds of small matrices (DiT LoRA r64: 528), and one
Newton–Schulz per parameter (5 iterations × 3 GEMMs) makes the step launch-bound on a GPU. Same
shape (and dtype/device) parameters are stacked `[N, m, n]` and orthogonalised by ONE batched
iteration, each slab normalised by its own Frobenius norm; buckets hold at most `bucket_size`
(16) slabs. 16 keeps a stack within a CPU's L3 cache: 16 × [64, 2048] float32 is 8 MiB
(arithmetic), and past that a stack's elementwise passes and the `baddbmm` leave the cache, so
larger caps run slower on the CPU. 16 already cuts NS launches 16×; on a
GPU a larger cap (or None) trades a few hundred MB of transient stacks for fewer launches.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args

import torch
from torch import nn

from hotstep_ray.core.contracts import MuonNsPrecision, NsPrecision
from hotstep_ray.core.precision import tf32_matmuls

MuonAdjustLr = Literal["original", "match_rms_adamw"]
NS_PRECISIONS: tuple[str, ...] = get_args(NsPrecision)


def resolve_ns_precision(setting: str, on_cuda: bool) -> NsPrecision:
    """ "auto" by device ("bfloat16_batched" on CUDA, "float32" elsewhere); a named precision
    as given."""
    if setting == "auto":
        return "bfloat16_batched" if on_cuda else "float32"
    if setting not in NS_PRECISIONS:
        raise ValueError(
            f"Muon ns_precision must be auto or one of {NS_PRECISIONS}, not {setting!r}"
        )
    return setting  # type: ignore[return-value]


def newton_schulz(
    grad: torch.Tensor,
    coefficients: tuple[float, float, float],
    steps: int,
    eps: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Quintic Newton–Schulz: G `[m, n]` -> ≈ U·S'·Vᵀ with S' ∈ (0.5, 1.5), in `dtype`.

    Works on the wide orientation (m <= n) so the Gram matrix `X Xᵀ` is the small `[m, m]`;
    the Frobenius normalisation bounds the spectral norm by 1 (one slab, one norm).

    A bucket `[N, m, n]` is N independent slabs: one batched iteration (`bmm`/`baddbmm`), each
    slab normalised by its OWN Frobenius norm — a global norm over the bucket would shrink a
    small-gradient slab's spectrum towards 0, where five steps cannot lift it. The 2-D path is
    torch's op sequence unchanged (the bf16 bit-for-bit reproduction relies on it)."""
    if grad.ndim not in (2, 3):
        raise ValueError(f"newton_schulz takes [m, n] or [N, m, n], got {tuple(grad.shape)}")
    a, b, c = coefficients
    tall = grad.size(-2) > grad.size(-1)
    if grad.ndim == 2:
        x = grad.to(dtype)
        x = x.mT if tall else x
        x = x / x.norm().clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.T  # [m, m]
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b·A + c·A²
            x = torch.addmm(x, poly, x, beta=a)  # a·X + (b·A + c·A²)·X
    else:
        # Normalised in `dtype` when it is float32 or wider (as the 2-D path), in float32 (or
        # the input's wider dtype) before a half-precision cast: a bf16 norm over a 512 x 1024
        # slab would add its own rounding to every element.
        wide = dtype.itemsize >= 4
        x = grad.to(dtype if wide else torch.promote_types(grad.dtype, torch.float32))
        x = x.mT if tall else x
        x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
        x = x.to(dtype)
        for _ in range(steps):
            gram = x @ x.mT  # [N, m, m]
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def lr_ratio(shape: torch.Size | tuple[int, ...], adjust_lr_fn: str | None) -> float:
    """torch.optim.Muon's per-shape LR multiplier."""
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"unknown adjust_lr_fn {adjust_lr_fn!r}")


class Muon(torch.optim.Muon):
    """`torch.optim.Muon` (same arguments, state and param groups) with the Newton–Schulz
    iteration at `ns_precision`. The update, per parameter:

        buf ← μ·buf + (1−μ)·g;  u ← (1−μ)·g + μ·buf (nesterov) or buf
        p ← p·(1 − lr·wd) − lr·ratio(shape)·NS(u)

    Bucketed. Hundreds of small LoRA matrices make a per-parameter step launch-bound (5 NS
    iterations × 3 GEMMs each), so parameters are grouped by (shape, dtypes, device) and each
    bucket runs ONE batched Newton–Schulz on its `[N, m, n]` stack (per-slab norm). Momentum,
    decay and the update are `torch._foreach_*` over the parameters; state stays one
    `momentum_buffer` per parameter, so `state_dict()` is torch's. `bucket_size` caps the slabs
    per NS call (None: no cap; the module docstring has the measurement). On CPU the result is
    bitwise the per-parameter loop's; on CUDA a batched GEMM may round differently (float32
    rounding).

    `ns_precision="bfloat16"` keeps the per-parameter loop: it exists to reproduce torch's step
    bit for bit, and a batched bf16 GEMM/norm need not round like torch's per-matrix ones.
    "bfloat16_batched" is the bucketed step with the iteration in bfloat16 (each slab's norm
    taken in float32 first); "auto" resolves to it when the parameters are on CUDA, else to
    "float32". "tf32" is the bucketed float32 step with TF32 GEMMs on CUDA."""

    def __init__(
        self,
        params: Any,
        *,
        ns_precision: MuonNsPrecision = "float32",
        bucket_size: int | None = 16,
        **kwargs: Any,
    ):
        super().__init__(params, **kwargs)
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1 or None, got {bucket_size}")
        on_cuda = any(p.is_cuda for group in self.param_groups for p in group["params"])
        self.ns_precision = resolve_ns_precision(ns_precision, on_cuda)
        self.bucket_size = bucket_size
        # GradScaler's convention, as torch's fused AdamW: a float tensor, nonzero = this step's
        # gradients are not finite and the step changes nothing (decided on the device)
        self.found_inf: torch.Tensor | None = None

    @property
    def ns_dtype(self) -> torch.dtype:
        """The dtype Newton–Schulz runs in (TF32 is float32 tensors on TF32 tensor cores)."""
        bf16 = self.ns_precision in ("bfloat16", "bfloat16_batched")
        return torch.bfloat16 if bf16 else torch.float32

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        precision = tf32_matmuls() if self.ns_precision == "tf32" else contextlib.nullcontext()
        found = self.found_inf
        if found is not None and self.ns_precision == "bfloat16":
            if bool(found):  # the exact per-parameter loop has no device gate: ask the host
                return loss
            found = None
        with precision:
            for group in self.param_groups:
                if self.ns_precision == "bfloat16":
                    self._step_per_parameter(group)
                else:
                    self._step_bucketed(group, found)
        return loss

    def _step_per_parameter(self, group: dict[str, Any]) -> None:
        """torch's loop, op for op (bf16 mode)."""
        lr, momentum = group["lr"], group["momentum"]
        for param in group["params"]:
            if param.grad is None:
                continue
            grad = param.grad
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - momentum)
            update = grad.lerp(buf, momentum) if group["nesterov"] else buf
            ortho = newton_schulz(
                update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
            )
            param.mul_(1 - lr * group["weight_decay"])
            param.add_(
                ortho.to(param.dtype), alpha=-lr * lr_ratio(param.shape, group["adjust_lr_fn"])
            )

    def _step_bucketed(self, group: dict[str, Any], found: torch.Tensor | None = None) -> None:
        """`found` (see `found_inf`): every change is scaled by keep = 1 − found on the device,
        so a skipped step leaves parameters and momenta bit for bit (the gradients must then be
        finite, e.g. zeroed: 0 × NaN is NaN)."""
        lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        bufs = []
        for param, grad in zip(params, grads, strict=True):
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad)
            bufs.append(state["momentum_buffer"])
        keep = None
        if found is None:
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
            if lr * decay != 0:  # p·1 is p: skipping is exact
                torch._foreach_mul_(params, 1 - lr * decay)
        else:  # buf += (1 − μ)·keep·(g − buf); p ×= 1 − lr·wd·keep
            keep = 1 - found.to(device=params[0].device, dtype=torch.float32)
            delta = torch._foreach_sub(grads, bufs)
            torch._foreach_mul_(delta, keep * (1 - momentum))
            torch._foreach_add_(bufs, delta)
            del delta
            if lr * decay != 0:
                torch._foreach_mul_(params, 1 - keep * (lr * decay))

        # (shape, dtypes, device) -> parameter indices. Exact shape, not "same wide side": NS
        # runs a tall `[in, r]` on its transposed VIEW, and stacking those views keeps that
        # layout, so every slab's GEMMs are the per-parameter ones (bitwise equal on CPU).
        buckets: dict[tuple[Any, ...], list[int]] = {}
        for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
            key = (tuple(param.shape), param.dtype, grad.dtype, param.device)
            buckets.setdefault(key, []).append(i)
        for members in buckets.values():
            cap = self.bucket_size or len(members)
            for start in range(0, len(members), cap):
                self._bucket_update(group, params, grads, bufs, members[start : start + cap], keep)

    def _bucket_update(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        bufs: list[torch.Tensor],
        idx: list[int],
        keep: torch.Tensor | None = None,
    ) -> None:
        """One bucket of same-shape parameters: stack, one batched NS, scatter back (scaled by
        `keep`, 0 or 1 on the device, when given)."""
        lr = group["lr"]
        if group["nesterov"]:  # u = g.lerp(buf, μ), in place on the fresh stack of g
            update = torch.stack([grads[i] for i in idx])
            update.lerp_(torch.stack([bufs[i] for i in idx]), group["momentum"])
        else:
            update = torch.stack([bufs[i] for i in idx])
        ortho = newton_schulz(
            update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
        )
        if keep is not None:
            ortho = ortho * keep.to(ortho.dtype)
        bucket = [params[i] for i in idx]
        # contiguous: a tall bucket comes back as a transposed view; foreach's fast path (one
        # launch per list, not per tensor) wants each slab laid out like its parameter.
        slabs = ortho.to(bucket[0].dtype, memory_format=torch.contiguous_format).unbind(0)
        ratio = lr_ratio(bucket[0].shape, group["adjust_lr_fn"])
        torch._foreach_add_(bucket, list(slabs), alpha=-lr * ratio)


def is_muon_param(param: torch.Tensor, min_dim: int) -> bool:
    """2-D with both sides >= min_dim (the short side of a LoRA A/B is the rank)."""
    return param.ndim == 2 and min(param.shape) >= min_dim


class HybridOptimizer:
    """Muon and AdamW behind one optimizer face: `step`, `zero_grad`, `state_dict`,
    `load_state_dict`, and `param_groups` (Muon's first) whose `base_lr` the schedule scales."""

    def __init__(
        self,
        muon: Muon | None,
        adamw: torch.optim.AdamW | None,
        muon_names: list[str],
        adamw_names: list[str],
    ) -> None:
        self.muon, self.adamw = muon, adamw
        self.muon_names, self.adamw_names = muon_names, adamw_names

    def _parts(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return [(n, o) for n, o in (("muon", self.muon), ("adamw", self.adamw)) if o is not None]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for _, opt in self._parts() for group in opt.param_groups]

    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """`found_inf`: a tensor on the parameters' device, nonzero when this step's gradients
        are not finite: then nothing changes, and the host need not have read it (Muon's
        bucketed step and torch's fused AdamW decide on the device; other paths read it).
        Without it, the step as torch's optimizers take it."""
        if found_inf is not None:  # exactly 1.0 or 0.0: fused AdamW skips on 1.0 only
            found_inf = (found_inf != 0).to(torch.float32)
        for _, opt in self._parts():
            fused = all(group.get("fused") for group in opt.param_groups)
            if found_inf is None or isinstance(opt, Muon) or fused:
                opt.found_inf = found_inf
                try:
                    opt.step()
                finally:
                    opt.found_inf = None
            elif not bool(found_inf):
                opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """`set_to_none=False` (the CUDA-graph trainers' stable gradient buffers) zeroes every
        buffer in one `_foreach_zero_`: torch's per-optimizer path zeroes tensor by tensor unless
        the optimizer declares `foreach`, which Muon does not (528 LoRA tensors on the 2B DiT:
        528 fill kernels and their launches while the GPU waits for the next step)."""
        if set_to_none:
            for _, opt in self._parts():
                opt.zero_grad(set_to_none=True)
            return
        grads = [p.grad for group in self.param_groups for p in group["params"]]
        present = [g for g in grads if g is not None]
        if present:
            torch._foreach_zero_(present)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self._parts()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        parts = dict(self._parts())
        if set(state) != set(parts):
            raise ValueError(f"optimizer state has parts {sorted(state)}, expected {sorted(parts)}")
        for name, opt in parts.items():
            opt.load_state_dict(state[name])

    def split_summary(self) -> str:
        """'448 Muon / 352 AdamW': parameter tensors per optimizer, printed at start."""
        return f"{len(self.muon_names)} Muon / {len(self.adamw_names)} AdamW"


def build_optimizer(
    named_params: Iterable[tuple[str, nn.Parameter]],
    kind: Literal["muon", "adamw"] = "muon",
    lr: float = 1e-4,
    weight_decay: float = 0.01,
    *,
    muon_lr_scale: float = 20.0,
    muon_momentum: float = 0.95,
    muon_ns_steps: int = 5,
    muon_min_dim: int = 16,
    muon_nesterov: bool = True,
    muon_adjust_lr: MuonAdjustLr = "original",
    muon_ns_precision: MuonNsPrecision = "auto",
    muon_bucket_size: int | None | Literal["auto"] = "auto",
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> HybridOptimizer:
    """Split `named_params` (frozen ones are skipped) between Muon and AdamW; with
    `kind="adamw"` everything goes to AdamW. Group `lr` starts at `base_lr`.
    `muon_ns_precision` "auto" resolves by the parameters' device (in `Muon`)."""
    muon_named: list[tuple[str, nn.Parameter]] = []
    adamw_named: list[tuple[str, nn.Parameter]] = []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        use_muon = kind == "muon" and is_muon_param(param, muon_min_dim)
        (muon_named if use_muon else adamw_named).append((name, param))
    on_cuda = any(p.is_cuda for _, p in muon_named + adamw_named)
    if muon_bucket_size == "auto":
        muon_bucket_size = None if on_cuda else 16
    muon = None
    if muon_named:
        muon_lr = lr * muon_lr_scale
        muon = Muon(
            [{"params": [p for _, p in muon_named], "base_lr": muon_lr}],
            lr=muon_lr,
            weight_decay=weight_decay / muon_lr_scale,
            momentum=muon_momentum,
            nesterov=muon_nesterov,
            ns_steps=muon_ns_steps,
            adjust_lr_fn=muon_adjust_lr,
            ns_precision=muon_ns_precision,
            bucket_size=muon_bucket_size,
        )
    adamw = None
    if adamw_named:
        adamw = torch.optim.AdamW(
            [{"params": [p for _, p in adamw_named], "base_lr": lr}],
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            fused=on_cuda or None,
        )
    if muon is None and adamw is None:
        raise ValueError("no trainable parameters to optimise")
    return HybridOptimizer(muon, adamw, [n for n, _ in muon_named], [n for n, _ in adamw_named])
