"""A fast inference path for diffusers' `AutoencoderOobleck` (the 48 kHz music VAE).

At 48 kHz the VAE's last stages hold [B, 128, S] tensors of hundreds of MB, so besides the convs
the time goes to memory traffic: diffusers' `Snake1d` (x + 1/(e^beta + 1e-9) * sin(e^alpha x)^2)
runs ~6 elementwise kernels, each reading and writing the whole tensor, and old-style weight norm
recomputes g * v / |v| for ~100 convs every forward. This module changes *how* the diffusers
modules run, never *what* they compute (the diffusers model stays the source of truth):

- weight norm folded into plain weights once (`fold_weight_norm`, exact);
- each `Snake1d` swapped for `FastSnake1d`: e^alpha and 1/(e^beta + 1e-9) precomputed once, the
  chain run as one kernel (a Triton kernel, a `torch.compile`d function, or plain torch);
- optionally every Conv1d / ConvTranspose1d as its Conv2d twin over [B, C, 1, T] tensors in
  channels-last memory (`layout="nhwc"`: cuDNN's tensor-core kernels want NHWC; the NCW layout
  costs a transpose per conv), same weights, same sums;
- with the nhwc layout, each residual unit as a `FastResidualUnit`: the 1x1 conv, its bias and
  the residual add as one GEMM over the [B * T, C] rows of the channels-last tensor (on CUDA in
  half precision one Triton kernel that also runs the Snake before it; 15 -> 7 full-tensor
  passes per unit), the 7-tap conv's bias folded into the Snake after it;
- optionally `torch.compile` of the whole decoder / encoder (fixed shapes), and CUDA-graph
  capture per input shape (the tiled decoder and the windowed encoder repeat a few shapes), all
  graphs of one model sharing one memory pool.

`FastOobleck(vae, options)` prepares a VAE *in place* (inference only) and offers `decode`
(latents [B, 64, T] -> audio [B, 2, T * hop]) and `encode` (audio [B, 2, S] -> moments
[B, 128, S // hop], mean ‖ raw scale), in the VAE's dtype, as `vae.decoder(z)` / `vae.encoder(x)`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from hotstep_ray.models.oobleck_kernels import (
    RESIDUAL_DTYPES,
    RESIDUAL_TILES,
    compiled_snake,
    residual_triton_fits,
    snake_linear_residual_triton,
    snake_torch,
    snake_triton,
    triton_usable,
)

log = logging.getLogger(__name__)

SnakeImpl = Literal["auto", "triton", "compile", "torch"]
Layout = Literal["ncw", "nhwc"]


class OobleckFastOptions(BaseModel):
    """How the VAE runs. `auto` picks the fastest safe choice for the device: on CUDA the Triton
    Snake (torch fallback when Triton is missing or fails its self-check) and CUDA graphs; on
    the CPU plain torch, no graphs, no compile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    snake: SnakeImpl = "auto"
    # "nhwc": Conv2d over [B, C, 1, T] in channels-last memory; it decodes faster than "ncw" on
    # the GPU, so it is the default.
    layout: Layout = "nhwc"
    compile: bool = False  # torch.compile the decoder / encoder (one compile per shape)
    cuda_graphs: bool | None = None  # None = on for CUDA; capture one graph per input shape
    # Distinct input shapes captured per model part; more run eagerly. A decode replica sees the
    # tile, up to tile / 64 tail lengths and the lengths of whole short clips; the graphs share
    # one pool and each keeps only its static input and output (a 768-frame window: 5.9 MB).
    max_graphs: int = 24
    capture_after: int = 2  # capture a shape on its n-th call (one-off shapes stay eager)
    # nhwc only: each residual unit's 1x1 conv + bias + residual add as one GEMM (on CUDA in
    # half precision one Triton kernel that also runs the Snake before it); see FastResidualUnit
    fuse_residual: bool = True


# ----------------------------------------------------------------------------- weight norm


_FOLDED = "_weight_norm_folded"  # per-module tally of fold_weight_norm calls on it


def _weight_norms(module: torch.nn.Module):
    """(submodule, parameter name, "hook" | "parametrization") for each weight norm in use."""
    from torch.nn.utils import parametrize

    for sub in module.modules():
        for hook in list(sub._forward_pre_hooks.values()):
            if type(hook).__name__ == "WeightNorm":
                yield sub, hook.name, "hook"
        if parametrize.is_parametrized(sub):
            for name in list(sub.parametrizations.keys()):
                if any(type(p).__name__ == "_WeightNorm" for p in sub.parametrizations[name]):
                    yield sub, name, "parametrization"


def fold_weight_norm(module: torch.nn.Module) -> int:
    """Bake weight norm (old-style hooks, which diffusers' Oobleck still uses as of 0.42, or
    new-style parametrizations) into plain weights, the same values. Inference only: g and v
    no longer exist. Returns how many were folded by this call (0 when already folded); the
    running total is kept on `module` (see `weight_norm_folded`)."""
    from torch.nn.utils import parametrize

    folded = 0
    for sub, name, kind in list(_weight_norms(module)):
        if kind == "hook":
            torch.nn.utils.remove_weight_norm(sub, name)
        else:
            parametrize.remove_parametrizations(sub, name, leave_parametrized=True)
        folded += 1
    setattr(module, _FOLDED, getattr(module, _FOLDED, 0) + folded)
    return folded


def weight_norm_folded(module: torch.nn.Module) -> int:
    """How many weight norms `fold_weight_norm` folded under `module` over all its calls (a
    caller may fold before `FastOobleck` does, as the preprocessing Encoder does)."""
    return sum(getattr(sub, _FOLDED, 0) for sub in module.modules())


def weight_norm_left(module: torch.nn.Module) -> int:
    """How many weight norms are still in use under `module` (0 once folded)."""
    return sum(1 for _ in _weight_norms(module))


# ----------------------------------------------------------------------------- Snake


class FastSnake1d(torch.nn.Module):
    """Drop-in for diffusers' `Snake1d` (inference): exp / reciprocal done once at build.

    Buffers: alpha, inv_beta as [1, C, 1] in the model dtype (the torch path: same values and
    order as the reference) and alpha32, inv_beta32 as float32 [C] (the fused kernel).
    `add_shift(bias)` makes it compute snake(x + bias): the bias of the conv before it, which
    then runs without one (the fused kernel adds it for free; cuDNN adds a conv bias in a
    separate pass over the whole output)."""

    def __init__(self, snake: torch.nn.Module, impl: str = "torch") -> None:
        super().__init__()
        if impl not in ("triton", "compile", "torch"):
            raise ValueError(f"snake impl {impl!r}: expected triton, compile or torch")
        self.impl = impl
        with torch.no_grad():
            raw_alpha, raw_beta = snake.alpha.detach(), snake.beta.detach()
            alpha = torch.exp(raw_alpha) if snake.logscale else raw_alpha
            beta = torch.exp(raw_beta) if snake.logscale else raw_beta
            inv_beta = (beta + 1e-9).reciprocal()  # as diffusers, in the parameter dtype
            alpha32 = raw_alpha.float().exp() if snake.logscale else raw_alpha.float()
            beta32 = raw_beta.float().exp() if snake.logscale else raw_beta.float()
        self.register_buffer("alpha", alpha.clone())  # [1, C, 1]
        self.register_buffer("inv_beta", inv_beta.clone())
        self.register_buffer("alpha32", alpha32.reshape(-1).contiguous())  # [C] float32
        self.register_buffer("inv_beta32", (beta32 + 1e-9).reciprocal().reshape(-1).contiguous())
        self.register_buffer("shift", None)  # [1, C, 1] model dtype, once set_shift ran
        self.register_buffer("shift32", None)  # [C] float32

    def add_shift(self, bias: torch.Tensor) -> None:
        """Compute snake(x + bias) from now on (on top of any earlier shift); bias: [C], the
        bias of the conv that feeds this Snake."""
        shift32 = bias.detach().to(self.alpha.device).float().reshape(-1)
        if self.shift32 is not None:
            shift32 = shift32 + self.shift32
        self.shift32 = shift32.contiguous()
        self.shift = shift32.to(self.alpha.dtype).reshape(1, -1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "triton" and x.is_cuda:
            return snake_triton(x, self.alpha32, self.inv_beta32, self.shift32)
        alpha, inv_beta, shift = self.alpha, self.inv_beta, self.shift
        if x.dim() == 4:  # [B, C, 1, T] (nhwc layout): broadcast over H and T
            alpha, inv_beta = alpha[..., None], inv_beta[..., None]
            shift = None if shift is None else shift[..., None]
        if shift is not None:
            x = x + shift  # the torch path pays the pass the conv would have paid
        if self.impl == "compile":
            return compiled_snake()(x, alpha, inv_beta)
        return snake_torch(x, alpha, inv_beta)


def resolve_snake(impl: str, device: torch.device) -> str:
    """`auto` -> triton on CUDA when importable, else torch; an explicit triton / compile off
    CUDA becomes torch (the CPU has no Triton; compile would only add start-up time)."""
    if impl not in ("auto", "triton", "compile", "torch"):
        raise ValueError(f"snake impl {impl!r}: expected auto, triton, compile or torch")
    if device.type != "cuda":
        return "torch"
    if impl in ("auto", "triton"):
        return "triton" if triton_usable() else "torch"
    return impl


@functools.cache  # once per (device, dtype) and process: every decoder/encoder built asks again
def triton_self_check(device: torch.device, dtype: torch.dtype) -> str | None:
    """Run the Triton Snake against the torch one on small NCW and NHWC tensors; returns an
    error text (the caller then falls back to torch) or None when they agree."""
    try:
        generator = torch.Generator().manual_seed(0)
        x = (3 * torch.randn(3, 5, 1, 77, generator=generator)).to(device, dtype)
        alpha = torch.rand(5, generator=generator).add(0.5).to(device)
        inv_beta = torch.rand(5, generator=generator).add(0.5).to(device)
        shift = torch.randn(5, generator=generator).to(device)
        for bias in (None, shift):
            shifted = x.float() if bias is None else x.float() + bias.view(1, 5, 1, 1)
            want = snake_torch(shifted, alpha.view(1, 5, 1, 1), inv_beta.view(1, 5, 1, 1))
            for probe in (x, x.contiguous(memory_format=torch.channels_last), x[:, :, 0]):
                got = snake_triton(probe, alpha, inv_beta, bias).float()
                expect = want if probe.dim() == 4 else want[:, :, 0]
                tol = 1e-5 if dtype == torch.float32 else 0.05
                if not torch.allclose(got, expect, atol=tol, rtol=tol):
                    return f"Triton Snake differs from torch by {(got - expect).abs().max():.3g}"
    except Exception as exc:  # a broken toolchain must not take the VAE down
        return f"Triton Snake failed: {exc!r}"
    return None


def swap_snakes(module: torch.nn.Module, impl: str) -> int:
    """Replace every diffusers Snake1d under `module` by a FastSnake1d. Returns the count."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "Snake1d":
                fast = FastSnake1d(child, impl)
                setattr(parent, name, fast.to(child.alpha.device))
                swapped += 1
            elif isinstance(child, FastSnake1d):
                child.impl = impl
    return swapped


# ----------------------------------------------------------------------------- layout


def conv_as_2d(conv: torch.nn.Module) -> torch.nn.Module:
    """A Conv1d / ConvTranspose1d as the Conv2d / ConvTranspose2d with kernel (1, k) over
    [B, C, 1, T]: the same weights (a view with a unit axis), hence the same sums."""
    two_d = torch.nn.Conv2d if isinstance(conv, torch.nn.Conv1d) else torch.nn.ConvTranspose2d
    extra = {}
    if isinstance(conv, torch.nn.ConvTranspose1d):
        extra["output_padding"] = (0, conv.output_padding[0])
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError(f"{conv}: only numeric zero padding converts to 2-D")
    with torch.device("meta"):
        new = two_d(
            conv.in_channels,
            conv.out_channels,
            kernel_size=(1, conv.kernel_size[0]),
            stride=(1, conv.stride[0]),
            padding=(0, conv.padding[0]),
            dilation=(1, conv.dilation[0]),
            groups=conv.groups,
            bias=conv.bias is not None,
            **extra,
        )
    weight = conv.weight.detach().unsqueeze(2)  # [out, in, 1, k] (transpose: [in, out, 1, k])
    new.weight = torch.nn.Parameter(weight.contiguous(memory_format=torch.channels_last), False)
    if conv.bias is not None:
        new.bias = torch.nn.Parameter(conv.bias.detach().clone(), False)
    return new


def convs_to_2d(module: torch.nn.Module) -> int:
    """Swap every Conv1d / ConvTranspose1d under `module` for its 2-D twin (after weight norm
    is folded). Returns the count."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                if child._forward_pre_hooks or hasattr(child, "parametrizations"):
                    raise ValueError(f"{name}: fold weight norm before converting convs")
                setattr(parent, name, conv_as_2d(child))
                swapped += 1
    return swapped


class Nhwc(torch.nn.Module):
    """Runs a module converted by `convs_to_2d` on [B, C, T] input: [B, C, 1, T] channels-last
    in, [B, C, T] (contiguous) out."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"expected [B, C, T], got {tuple(x.shape)}")
        x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        return self.inner(x).squeeze(2).contiguous()


# ----------------------------------------------------------------------------- residual units
#
# diffusers' OobleckResidualUnit: y = x + conv2(snake2(conv1(snake1(x)))), conv1 kernel 7
# (dilation d, length kept), conv2 kernel 1. In channels-last [B, C, 1, T] memory a tensor is a
# row-major [B * T, C] matrix, so conv2 is a GEMM [B * T, C] @ W2^T [C, C]. Full-tensor passes
# per unit (N = one read or write of a [B, C, 1, T] tensor; cuDNN adds a conv bias in a
# separate read-modify-write of the output, at about the cost of the add below):
#   diffusers / nhwc before: snake1 2 | conv1 2 + bias 2 | snake2 2 | conv2 2 + bias 2 | add 3
#                            = 15 N
#   torch path (below):      snake1 2 | conv1 2 (bias moved into snake2) | snake2 2 |
#                            linear with bias epilogue 2 | add 3 = 11 N
#   Triton path (`oobleck_kernels.snake_linear_residual_triton`): snake1 2 | conv1 2 |
#                            one kernel: read conv1's output, snake2
#                            (+ conv1's bias) in registers, GEMM, + conv2's bias + residual in
#                            the epilogue, one write = 3 N; 7 N in all
# (`torch.addmm(x2d, h2d, W2^T)` does not get there: out of place it first copies x into the
# output (2 N more), in place it overwrites the unit's input, and either way the bias costs a
# pass.) The biases of the convs that feed a unit (decoder: the upsampling conv_t1; encoder: the
# first conv and each downsampling conv1) move into the unit as well (`fold_conv_biases`).
# The kernel's rates: docs/BENCHMARKS.md, row `oobleck-sweep`; end to end: `decode-fast`.


class FastResidualUnit(torch.nn.Module):
    """Drop-in for diffusers' `OobleckResidualUnit` once `fold_weight_norm`, `swap_snakes` and
    `convs_to_2d` ran over it: [B, C, 1, T] in, [B, C, 1, T] channels-last out.

    conv1's bias moves into snake2 (its `add_shift`); conv2 (1x1) becomes a [C, C] matrix, and
    conv2 + bias + the residual add run as one GEMM (`impl="triton"`: one kernel that also does
    snake2) or as `F.linear` with the bias in its epilogue plus one add (`impl="torch"`). The pass
    counts are in the comment above."""

    def __init__(self, unit: torch.nn.Module, impl: str = "torch") -> None:
        super().__init__()
        snake1, conv1, snake2, conv2 = unit.snake1, unit.conv1, unit.snake2, unit.conv2
        if not (isinstance(snake1, FastSnake1d) and isinstance(snake2, FastSnake1d)):
            raise ValueError("swap the Snakes (swap_snakes) before fusing residual units")
        if not (isinstance(conv1, torch.nn.Conv2d) and isinstance(conv2, torch.nn.Conv2d)):
            raise ValueError("convert the convs (convs_to_2d) before fusing residual units")
        if conv2.kernel_size != (1, 1) or conv2.stride != (1, 1) or conv2.groups != 1:
            raise ValueError(f"conv2 {conv2}: expected a plain 1x1 conv")
        self.impl = impl
        self.snake1, self.conv1, self.snake2 = snake1, conv1, snake2
        if conv1.bias is not None:
            snake2.add_shift(conv1.bias)
            _drop_bias(conv1)
        elif snake2.shift32 is None:  # the Triton kernel always reads a shift
            snake2.add_shift(torch.zeros_like(snake2.alpha32))
        weight = conv2.weight.detach().reshape(conv2.out_channels, conv2.in_channels)
        bias = conv2.bias.detach() if conv2.bias is not None else weight.new_zeros(weight.shape[0])
        self.register_buffer("weight", weight.contiguous())  # [C_out, C_in] for F.linear
        self.register_buffer("weight_t", weight.t().contiguous())  # [C_in, C_out] for Triton
        self.register_buffer("bias", bias.clone())  # [C_out] model dtype
        self.register_buffer("bias32", bias.float().contiguous())

    def add_input_shift(self, bias: torch.Tensor) -> None:
        """Compute unit(x + bias) from now on; bias: [C], the bias of the conv that feeds this
        unit, which then runs without one. Free: x + bias reaches snake1 as its shift and the
        residual sum as part of conv2's bias (out = x + bias + conv2(...) + b2)."""
        self.snake1.add_shift(bias)
        self.bias32 = (self.bias32 + bias.detach().to(self.bias32.device).float()).contiguous()
        self.bias = self.bias32.to(self.bias.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"expected [B, C, 1, T] (the nhwc layout), got {tuple(x.shape)}")
        h = self.conv1(self.snake1(x))  # [B, C, 1, T'] channels-last, conv1's bias not added
        if self.impl == "triton" and residual_triton_fits(h, x):
            snake2 = self.snake2
            return snake_linear_residual_triton(
                h,
                x,
                self.weight_t,
                self.bias32,
                snake2.alpha32,
                snake2.inv_beta32,
                snake2.shift32,
            )
        h = self.snake2(h)  # + conv1's bias
        batch, channels, height, length = h.shape
        # [B, C, 1, T'] channels-last -> [B * T', C] (a view; a copy for other strides)
        rows = h.permute(0, 2, 3, 1).reshape(-1, channels)
        y = torch.nn.functional.linear(rows, self.weight, self.bias)  # [B * T', C_out]
        y = y.view(batch, height, length, -1).permute(0, 3, 1, 2)  # channels-last again
        crop = (x.shape[-1] - length) // 2  # as diffusers; 0 with these paddings
        if crop > 0:
            x = x[..., crop:-crop]
        return y.add_(x)


def fuse_residuals(module: torch.nn.Module, impl: str) -> int:
    """Replace every diffusers OobleckResidualUnit under `module` by a FastResidualUnit (needs
    the nhwc conversion first) and set `impl` on those already replaced. Returns how many
    FastResidualUnits `module` holds afterwards."""
    fused = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "OobleckResidualUnit":
                setattr(parent, name, FastResidualUnit(child, impl))
                fused += 1
            elif isinstance(child, FastResidualUnit):
                child.impl = impl
                fused += 1
    return fused


def fold_conv_biases(part: torch.nn.Module) -> int:
    """Move the bias of each conv whose output goes only to a FastSnake1d or a FastResidualUnit
    into that consumer (cuDNN adds a conv bias as a separate pass over the output; the consumers
    add it for free). `part`: a diffusers OobleckDecoder / OobleckEncoder after `fuse_residuals`;
    the pairs follow their forward order:
      decoder: conv1 -> block[0].snake1; block[i]: snake1 -> conv_t1 -> res_unit1..3
      encoder: conv1 -> block[0].res_unit1; block[i]: res_unit1..3 -> snake1 -> conv1 ->
               block[i + 1].res_unit1 (the last block: the encoder's snake1)
    (the final conv2 of each keeps any bias: its output is the result). Returns how many moved."""
    kind = type(part).__name__
    blocks = list(getattr(part, "block", []))
    pairs: list[tuple[torch.nn.Module, torch.nn.Module]] = []
    if kind == "OobleckDecoder" and blocks:
        pairs.append((part.conv1, blocks[0].snake1))
        pairs += [(block.conv_t1, block.res_unit1) for block in blocks]
    elif kind == "OobleckEncoder" and blocks:
        pairs.append((part.conv1, blocks[0].res_unit1))
        consumers = [block.res_unit1 for block in blocks[1:]] + [part.snake1]
        pairs += [(block.conv1, after) for block, after in zip(blocks, consumers, strict=True)]
    moved = 0
    for conv, consumer in pairs:
        if getattr(conv, "bias", None) is None:
            continue  # already moved (a VAE prepared twice)
        if isinstance(consumer, FastResidualUnit):
            consumer.add_input_shift(conv.bias)
        elif isinstance(consumer, FastSnake1d):
            consumer.add_shift(conv.bias)
        else:
            continue
        _drop_bias(conv)
        moved += 1
    return moved


def _drop_bias(conv: torch.nn.Module) -> None:
    """The conv runs without its bias (a consumer adds it); marked for `describe`."""
    conv.register_parameter("bias", None)
    conv.bias_folded = True


def count_folded_biases(module: torch.nn.Module) -> int:
    """How many conv biases under `module` moved into the Snake / residual unit after them."""
    return sum(getattr(sub, "bias_folded", False) is True for sub in module.modules())


@functools.cache  # once per (device, dtype) and process, as `triton_self_check`
def residual_self_check(device: torch.device, dtype: torch.dtype) -> str | None:
    """Run the fused Triton residual kernel against the torch path on a small unit; returns an
    error text (the caller then keeps the torch path) or None when they agree."""
    try:
        generator = torch.Generator().manual_seed(1)
        channels = min(RESIDUAL_TILES, default=128)
        length = 333  # a partial row tile
        unit = _probe_unit(channels, generator, device, dtype)
        x = torch.randn(2, channels, 1, length, generator=generator).to(device, dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        fast = FastResidualUnit(unit, "triton")
        got = fast(x).float()
        fast.impl = "torch"
        want = fast(x).float()
        error = float((got - want).abs().max() / want.abs().max())
        if not error < 0.02:
            return f"fused Triton residual differs from torch by {error:.3g} (relative)"
    except Exception as exc:  # a broken toolchain must not take the VAE down
        return f"fused Triton residual failed: {exc!r}"
    return None


def _probe_unit(
    channels: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """A stand-in OobleckResidualUnit (same attribute names) already in its prepared form, on
    `device` in `dtype` (the Snakes' float32 kernel buffers stay float32)."""

    class _Snake(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.alpha = torch.nn.Parameter(0.5 * torch.randn(1, channels, 1, generator=generator))
            self.beta = torch.nn.Parameter(0.5 * torch.randn(1, channels, 1, generator=generator))
            self.logscale = True

    unit = torch.nn.Module()
    unit.conv1 = torch.nn.Conv2d(channels, channels, (1, 7), padding=(0, 9), dilation=(1, 3))
    unit.conv2 = torch.nn.Conv2d(channels, channels, 1)
    with torch.no_grad():
        for conv in (unit.conv1, unit.conv2):
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * 0.05)
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=generator))
    unit = unit.requires_grad_(False).to(device, dtype)
    unit.snake1 = FastSnake1d(_Snake().to(device, dtype), "triton")
    unit.snake2 = FastSnake1d(_Snake().to(device, dtype), "triton")
    return unit


# ----------------------------------------------------------------------------- CUDA graphs


def release_cached_blocks(device: torch.device) -> bool:
    """Return the CUDA caching allocator's unused blocks to the driver; True when it did (the
    CPU has no such cache). CUDA-graph pools are not touched. Used where a working set that
    nothing will reuse would otherwise stay reserved: after a graph capture's warm-up, after a
    new shape's eager first call, between preprocessing stages."""
    if device.type != "cuda":
        return False
    torch.cuda.empty_cache()
    return True


class ShapeGraphs:
    """Replays one CUDA graph per input shape of `fn` (a pure function of its input tensor).

    The `capture_after`-th call with a shape warms up on a side stream and captures (earlier
    calls run eagerly, so a one-off shape costs no capture); later calls copy the input into
    the static buffer and replay. The result is a fresh tensor (the static
    output is overwritten by the next replay). All graphs share one memory pool, which is safe
    because replays never overlap (one lock). The first capture sizes that pool and later ones
    reuse its free blocks, so a caller captures its largest shape first (TiledVaeDecoder.warm):
    a larger shape captured later needs bigger blocks and grows the pool. Beyond `max_graphs`
    shapes, or when capture fails, `fn` runs eagerly."""

    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        max_graphs: int = 8,
        capture_after: int = 2,
    ) -> None:
        self.fn, self.max_graphs, self.capture_after = fn, max_graphs, max(1, capture_after)
        self.seen: dict[tuple, int] = {}
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.failed: set[tuple] = set()
        self._pool = None
        self._lock = threading.Lock()

    @staticmethod
    def key(x: torch.Tensor) -> tuple:
        return (tuple(x.shape), x.dtype, x.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = self.key(x)
        with self._lock:
            if key not in self.graphs:
                self.seen[key] = self.seen.get(key, 0) + 1
                if (
                    key in self.failed
                    or len(self.graphs) >= self.max_graphs
                    or self.seen[key] < self.capture_after
                ):
                    out = self.fn(x)
                    if self.seen[key] == 1:
                        self._release_cache(x.device)
                    return out
                try:
                    self._capture(key, x)
                except Exception as exc:  # an optimisation: never fail the decode for it
                    log.warning("CUDA graph capture for %s failed (%s); running eagerly", key, exc)
                    self.failed.add(key)
                    torch.cuda.synchronize(x.device)
                    return self.fn(x)
            graph, static_in, static_out = self.graphs[key]
            static_in.copy_(x)
            graph.replay()
            return static_out.clone()

    def _capture(self, key: tuple, x: torch.Tensor) -> None:
        static_in = x.clone()
        stream = torch.cuda.Stream(x.device)
        stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # cuDNN autotuning and lazy init happen outside the capture
                self.fn(static_in)
        torch.cuda.current_stream(x.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # "thread_local": only this thread's unsafe CUDA calls break the capture. Another
        # thread may be running its own kernels meanwhile (a Serve replica's other requests,
        # on its worker threads), which "global" would turn into a failed capture, and a
        # failed shape runs eagerly from then on.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            static_out = self.fn(static_in)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = (graph, static_in, static_out)
        # The warm-up's activations were cached for the side stream, where nothing else will
        # reuse them: return them, or every captured shape keeps a window's activations twice
        # (the goal is <= 4 GiB per decode replica; its peaks: docs/BENCHMARKS.md, row
        # `decode-fast`).
        torch.cuda.synchronize(x.device)
        release_cached_blocks(x.device)

    # After a new shape's first (eager) call: its activations, now free, stay cached in the
    # normal pool, where nothing but another eager call reuses them; once the shape is captured
    # its replays use the graph pool, so a replica would hold one window of activations in
    # each. Give them back (once per shape: empty_cache syncs the device).
    _release_cache = staticmethod(release_cached_blocks)


# ----------------------------------------------------------------------------- the wrapper


def _passes(check: Callable, device: torch.device, dtype: torch.dtype, fallback: str) -> bool:
    """Whether a Triton self-check passes; a failure is logged with the torch path it falls back
    to (an optimisation never stops the VAE)."""
    problem = check(device, dtype)
    if problem:
        log.warning("%s; using the torch %s", problem, fallback)
    return not problem


class FastOobleck:
    """A diffusers AutoencoderOobleck prepared for fast inference (modified in place).

    `decode(z)`: latents [B, 64, T] -> audio [B, 2, T * hop]; `encode(x)`: audio [B, 2, S] ->
    moments [B, 2 * 64, S // hop] (mean ‖ raw scale). Both in the VAE's dtype on its device,
    equal to `vae.decoder(z)` / `vae.encoder(x)` up to float rounding."""

    def __init__(self, vae: torch.nn.Module, options: OobleckFastOptions | None = None) -> None:
        options = options or OobleckFastOptions()
        self.vae = vae.eval().requires_grad_(False)
        param = next(vae.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.options = options
        fold_weight_norm(vae)
        # Totals, not this call's count: a caller that folded first must not read as "0 folded".
        self.folded, self.unfolded = weight_norm_folded(vae), weight_norm_left(vae)
        snake = resolve_snake(options.snake, self.device)
        if options.compile:
            snake = "torch"  # inductor fuses the plain expression with its neighbours
        if snake == "triton" and not _passes(triton_self_check, self.device, self.dtype, "Snake"):
            snake = "torch"
        self.snake_impl = snake
        self.snakes = swap_snakes(vae, snake)
        if options.layout == "nhwc" and not isinstance(vae.decoder, Nhwc):
            # The wrappers replace the VAE's own parts, so `vae.decode` / `vae.encode` keep
            # working on [B, C, T] tensors after the conversion.
            convs_to_2d(vae.decoder)
            convs_to_2d(vae.encoder)
            vae.decoder, vae.encoder = Nhwc(vae.decoder), Nhwc(vae.encoder)
        self.layout = "nhwc" if isinstance(vae.decoder, Nhwc) else "ncw"
        self.residual_impl: str | None = None
        if self.layout == "nhwc" and options.fuse_residual:
            impl = "triton" if snake == "triton" and self.dtype in RESIDUAL_DTYPES else "torch"
            if impl == "triton" and not _passes(
                residual_self_check, self.device, self.dtype, "residual path"
            ):
                impl = "torch"
            self.residual_impl = impl
            for wrapper in (vae.decoder, vae.encoder):
                fuse_residuals(wrapper, impl)
                fold_conv_biases(wrapper.inner)
        # what the VAE holds (an already prepared VAE keeps its fused units)
        self.residuals = sum(isinstance(m, FastResidualUnit) for m in vae.modules())
        self.biases_moved = count_folded_biases(vae)
        decode: Callable = vae.decoder
        encode: Callable = vae.encoder
        if options.compile:
            decode = torch.compile(vae.decoder, dynamic=False)
            encode = torch.compile(vae.encoder, dynamic=False)
        graphs = options.cuda_graphs
        self.uses_graphs = self.device.type == "cuda" and (graphs is None or graphs)
        if self.uses_graphs:
            decode = ShapeGraphs(decode, options.max_graphs, options.capture_after)
            encode = ShapeGraphs(encode, options.max_graphs, options.capture_after)
        self._decode, self._encode = decode, encode
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # few fixed shapes: autotune once each

    def describe(self) -> dict[str, object]:
        """What was chosen, for logs and benchmark rows."""
        return {
            "snake": self.snake_impl,
            "layout": self.layout,
            "compile": self.options.compile,
            "cuda_graphs": self.uses_graphs,
            "weight_norm_folded": self.folded,  # by any fold_weight_norm call on this VAE
            "weight_norm_left": self.unfolded,  # 0: no conv recomputes g * v / |v|
            "snakes_swapped": self.snakes,
            "residuals_fused": self.residuals,  # FastResidualUnits (diffusers: 15 + 15)
            "residual_impl": self.residual_impl,  # "triton" | "torch" | None (not fused)
            # conv biases added by the Snake / residual unit after the conv instead of a pass
            "conv_biases_folded": self.biases_moved,
        }

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """[B, 64, T] latents (any dtype) -> [B, 2, T * hop] audio in the VAE dtype."""
        return self._decode(z.to(self.device, self.dtype).contiguous())

    @torch.no_grad()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, 2, S] audio -> [B, 128, S // hop] moments (mean ‖ raw scale) in the VAE dtype."""
        return self._encode(audio.to(self.device, self.dtype).contiguous())


def fast_default(device: torch.device | str) -> bool:
    """The fast path is on by default on CUDA, off on the CPU (where the reference modules are
    what the tests compare against and nothing is gained)."""
    return torch.device(device).type == "cuda"
