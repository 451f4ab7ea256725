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
- optionally `torch.compile` of the whole decoder / encoder (fixed shapes), and CUDA-graph
  capture per input shape (the tiled decoder and the windowed encoder repeat a few shapes), all
  graphs of one model sharing one memory pool.

`FastOobleck(vae, options)` prepares a VAE *in place* (inference only) and offers `decode`
(latents [B, 64, T] -> audio [B, 2, T * hop]) and `encode` (audio [B, 2, S] -> moments
[B, 128, S // hop], mean ‖ raw scale), in the VAE's dtype, as `vae.decoder(z)` / `vae.encoder(x)`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

SnakeImpl = Literal["auto", "triton", "compile", "torch"]
Layout = Literal["ncw", "nhwc"]


class OobleckFastOptions(BaseModel):
    """How the VAE runs. `auto` picks the fastest safe choice for the device: on CUDA the Triton
    Snake (torch fallback when Triton is missing or fails its self-check) and CUDA graphs; on
    the CPU plain torch, no graphs, no compile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    snake: SnakeImpl = "auto"
    # "nhwc": Conv2d over [B, C, 1, T] in channels-last memory. H200, 240 s decode: 185 ms vs
    # 229 ms for "ncw" (docs/BENCHMARKS.md), so it is the default.
    layout: Layout = "nhwc"
    compile: bool = False  # torch.compile the decoder / encoder (one compile per shape)
    cuda_graphs: bool | None = None  # None = on for CUDA; capture one graph per input shape
    max_graphs: int = 8  # distinct input shapes captured per model part; more run eagerly
    capture_after: int = 2  # capture a shape on its n-th call (one-off shapes stay eager)


# ----------------------------------------------------------------------------- weight norm


def fold_weight_norm(module: torch.nn.Module) -> int:
    """Bake weight norm (old-style hooks or new-style parametrizations) into plain weights, the
    same values. Inference only: g and v no longer exist. Returns how many were folded."""
    from torch.nn.utils import parametrize

    folded = 0
    for sub in module.modules():
        for hook in list(sub._forward_pre_hooks.values()):
            if type(hook).__name__ == "WeightNorm":
                torch.nn.utils.remove_weight_norm(sub, hook.name)
                folded += 1
        if parametrize.is_parametrized(sub):
            for name in list(sub.parametrizations.keys()):
                kinds = {type(p).__name__ for p in sub.parametrizations[name]}
                if "_WeightNorm" in kinds:
                    parametrize.remove_parametrizations(sub, name, leave_parametrized=True)
                    folded += 1
    return folded


# ----------------------------------------------------------------------------- Snake


def snake_torch(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """x + inv_beta * sin(alpha * x)^2, alpha / inv_beta broadcast over channels (dim 1). The
    same operation order as diffusers' Snake1d, so float32 results are bit-identical."""
    return x + inv_beta * torch.sin(alpha * x).pow(2)


_TRITON: dict[str, object] = {}  # lazily built kernels (None = Triton unusable here)
_MAX_GRID_ROWS = 65_535  # CUDA's limit on grid axis 1 (the NCW kernel's B * C rows)


def _triton_kernels():
    """(NCW kernel, channels-last kernel), or None when Triton is not importable. No integer
    division per element: NCW programs own one (batch, channel) row, so alpha is a scalar;
    channels-last programs own a [rows, C] tile and load alpha as a vector once."""
    if "kernels" in _TRITON:
        return _TRITON["kernels"]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _TRITON["kernels"] = None
        return None

    @triton.jit
    def snake_ncw(x_ptr, alpha_ptr, inv_beta_ptr, out_ptr, channels, length, BLOCK: tl.constexpr):
        row = tl.program_id(1)  # b * C + c
        alpha = tl.load(alpha_ptr + row % channels)
        inv_beta = tl.load(inv_beta_ptr + row % channels)
        t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = t < length
        offsets = row.to(tl.int64) * length + t
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        wave = tl.sin(alpha * x)
        tl.store(
            out_ptr + offsets, (x + inv_beta * wave * wave).to(out_ptr.dtype.element_ty), mask=mask
        )

    @triton.jit
    def snake_nwc(
        x_ptr,
        alpha_ptr,
        inv_beta_ptr,
        out_ptr,
        rows,
        channels,
        ROWS: tl.constexpr,
        CH: tl.constexpr,
    ):
        channel = tl.arange(0, CH)
        in_channels = channel < channels
        alpha = tl.load(alpha_ptr + channel, mask=in_channels, other=0.0)
        inv_beta = tl.load(inv_beta_ptr + channel, mask=in_channels, other=0.0)
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # b * T + t
        mask = (row < rows)[:, None] & in_channels[None, :]
        offsets = row[:, None] * channels + channel[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        wave = tl.sin(alpha[None, :] * x)
        y = x + inv_beta[None, :] * wave * wave
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    _TRITON["kernels"] = (snake_ncw, snake_nwc, triton.next_power_of_2)
    return _TRITON["kernels"]


def _triton_kernel():
    """Whether Triton is usable (kept as a function for the gating logic and tests)."""
    return _triton_kernels()


def snake_layout(x: torch.Tensor) -> tuple[int, int] | None:
    """(channels, inner stride) when `x` ([B, C, T] or [B, C, 1, T]) is dense in NCW order or
    in channels-last order, else None (the caller makes it contiguous)."""
    channels = x.shape[1]
    if x.is_contiguous():
        return channels, x[0, 0].numel()
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return channels, 1
    return None


def snake_triton(x: torch.Tensor, alpha32: torch.Tensor, inv_beta32: torch.Tensor) -> torch.Tensor:
    """The fused kernel: one read and one write of x. alpha32 / inv_beta32: float32 [C]."""
    snake_ncw, snake_nwc, next_power_of_2 = _triton_kernels()
    layout = snake_layout(x)
    if layout is None or (layout[1] != 1 and x.shape[0] * x.shape[1] > _MAX_GRID_ROWS):
        x = x.contiguous()
        layout = snake_layout(x)
        if x.shape[0] * x.shape[1] > _MAX_GRID_ROWS:  # beyond the grid: plain torch
            return snake_torch(
                x, alpha32.to(x.dtype).view(1, -1, 1), inv_beta32.to(x.dtype).view(1, -1, 1)
            )
    channels, inner = layout
    out = torch.empty_like(x)  # keeps x's memory format
    if inner == 1:  # channels-last: [B * T rows, C]
        rows = x.numel() // channels
        width = next_power_of_2(channels)
        per_program = max(1, 4096 // width)
        grid = (triton_cdiv(rows, per_program),)
        snake_nwc[grid](x, alpha32, inv_beta32, out, rows, channels, ROWS=per_program, CH=width)
    else:
        block = 2048
        grid = (triton_cdiv(inner, block), x.shape[0] * channels)
        snake_ncw[grid](x, alpha32, inv_beta32, out, channels, inner, BLOCK=block)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


_COMPILED: dict[str, Callable] = {}


def _compiled_snake() -> Callable:
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(snake_torch, dynamic=True)
    return _COMPILED["fn"]


class FastSnake1d(torch.nn.Module):
    """Drop-in for diffusers' `Snake1d` (inference): exp / reciprocal done once at build.

    Buffers: alpha, inv_beta as [1, C, 1] in the model dtype (the torch path: same values and
    order as the reference) and alpha32, inv_beta32 as float32 [C] (the fused kernel)."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "triton" and x.is_cuda:
            return snake_triton(x, self.alpha32, self.inv_beta32)
        alpha, inv_beta = self.alpha, self.inv_beta
        if x.dim() == 4:  # [B, C, 1, T] (nhwc layout): broadcast over H and T
            alpha, inv_beta = alpha[..., None], inv_beta[..., None]
        if self.impl == "compile":
            return _compiled_snake()(x, alpha, inv_beta)
        return snake_torch(x, alpha, inv_beta)


def resolve_snake(impl: str, device: torch.device) -> str:
    """`auto` -> triton on CUDA when importable, else torch; an explicit triton / compile off
    CUDA becomes torch (the CPU has no Triton; compile would only add start-up time)."""
    if impl not in ("auto", "triton", "compile", "torch"):
        raise ValueError(f"snake impl {impl!r}: expected auto, triton, compile or torch")
    if device.type != "cuda":
        return "torch"
    if impl in ("auto", "triton"):
        return "triton" if _triton_kernel() is not None else "torch"
    return impl


def triton_self_check(device: torch.device, dtype: torch.dtype) -> str | None:
    """Run the Triton Snake against the torch one on small NCW and NHWC tensors; returns an
    error text (the caller then falls back to torch) or None when they agree."""
    try:
        generator = torch.Generator().manual_seed(0)
        x = (3 * torch.randn(3, 5, 1, 77, generator=generator)).to(device, dtype)
        alpha = torch.rand(5, generator=generator).add(0.5).to(device)
        inv_beta = torch.rand(5, generator=generator).add(0.5).to(device)
        want = snake_torch(x.float(), alpha.view(1, 5, 1, 1), inv_beta.view(1, 5, 1, 1))
        for probe in (x, x.contiguous(memory_format=torch.channels_last), x[:, :, 0]):
            got = snake_triton(probe, alpha, inv_beta).float()
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


# ----------------------------------------------------------------------------- CUDA graphs


class ShapeGraphs:
    """Replays one CUDA graph per input shape of `fn` (a pure function of its input tensor).

    The `capture_after`-th call with a shape warms up on a side stream and captures (earlier
    calls run eagerly, so a one-off shape costs no capture); later calls copy the input into
    the static buffer and replay. The result is a fresh tensor (the static
    output is overwritten by the next replay). All graphs share one memory pool, which is safe
    because replays never overlap (one lock). Beyond `max_graphs` shapes, or when capture
    fails, `fn` runs eagerly."""

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
                    return self.fn(x)
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
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self.fn(static_in)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = (graph, static_in, static_out)


# ----------------------------------------------------------------------------- the wrapper


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
        self.folded = fold_weight_norm(vae)
        snake = resolve_snake(options.snake, self.device)
        if options.compile:
            snake = "torch"  # inductor fuses the plain expression with its neighbours
        if snake == "triton":
            problem = triton_self_check(self.device, self.dtype)
            if problem:
                log.warning("%s; using the torch Snake", problem)
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
            "weight_norm_folded": self.folded,
            "snakes_swapped": self.snakes,
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
