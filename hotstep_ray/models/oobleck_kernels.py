"""The Oobleck fast path's GPU kernels (`models.oobleck_fast` swaps them into the VAE).

- Snake, x + 1/(e^beta + 1e-9) * sin(e^alpha * x)^2, as one Triton kernel (NCW rows or
  channels-last tiles, optionally with a folded conv bias: snake(x + shift)), with a plain torch
  twin (`snake_torch`, bit-identical to diffusers' operation order in float32). Half-precision
  tensors take the hardware sin (`SNAKE_FAST_SIN`); program sizes by width in
  `SNAKE_NWC_CONFIGS`.
- The residual unit's tail, x + conv2(snake2(h + shift)) with a 1x1 conv2, as one Triton GEMM
  kernel over channels-last [B * T, C] rows (bf16 / fp16, C in `RESIDUAL_TILES`).
- `bench/oobleck_kernel_sweep.py` times the configurations on an encoder window's shapes.

Kernels are built lazily: importing this module needs no Triton and no GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# ----------------------------------------------------------------------------- Snake


def snake_torch(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """x + inv_beta * sin(alpha * x)^2, alpha / inv_beta broadcast over channels (dim 1). The
    same operation order as diffusers' Snake1d, so float32 results are bit-identical."""
    return x + inv_beta * torch.sin(alpha * x).pow(2)


_TRITON: dict[str, object] = {}  # lazily built kernels (None = Triton unusable here)
HALF_DTYPES = (torch.bfloat16, torch.float16)
# bf16 / fp16 tensors: the hardware sin after reducing the phase to [-pi, pi] (within ~1e-6 +
# |phase| * 2e-7 of libdevice's, far below a half-precision output's rounding) instead of
# libdevice's accurate sin, whose range reduction made the kernel compute-bound: in the
# encoder's profile the Snake kernel ran well below the GPU's memory bandwidth (the fast sin's
# rates: docs/BENCHMARKS.md, row `oobleck-sweep`). float32 tensors keep the accurate sin, so
# the float32 path stays within 1e-5 of diffusers'.
SNAKE_FAST_SIN = True
# The channels-last Snake's program size: (elements per program, rounded to whole rows of the
# channel width; warps), by channel width. bench/oobleck_kernel_sweep.py times the alternatives
# on one encoder window's shapes: 128 and 256 channels gain from 8192 elements / 16 warps, 512
# does not (the committed configuration's times: docs/BENCHMARKS.md, row `oobleck-sweep`).
SNAKE_NWC_CONFIG = (4096, 4)
SNAKE_NWC_CONFIGS: dict[int, tuple[int, int]] = {128: (8192, 16), 256: (8192, 16)}
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
    def snake_ncw(
        x_ptr,
        alpha_ptr,
        inv_beta_ptr,
        shift_ptr,
        out_ptr,
        channels,
        length,
        BLOCK: tl.constexpr,
        HAS_SHIFT: tl.constexpr,
        FAST_SIN: tl.constexpr,
    ):
        row = tl.program_id(1)  # b * C + c
        alpha = tl.load(alpha_ptr + row % channels)
        inv_beta = tl.load(inv_beta_ptr + row % channels)
        t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = t < length
        offsets = row.to(tl.int64) * length + t
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_SHIFT:  # the preceding conv's bias, added here instead of in its own pass
            x = x + tl.load(shift_ptr + row % channels)
        phase = alpha * x
        if FAST_SIN:  # see SNAKE_FAST_SIN
            phase = phase - tl.floor(phase * 0.15915494309189535 + 0.5) * 6.283185307179586
            wave = tl.inline_asm_elementwise(
                "sin.approx.f32 $0, $1;", "=r,r", [phase], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            wave = tl.sin(phase)
        tl.store(
            out_ptr + offsets, (x + inv_beta * wave * wave).to(out_ptr.dtype.element_ty), mask=mask
        )

    @triton.jit
    def snake_nwc(
        x_ptr,
        alpha_ptr,
        inv_beta_ptr,
        shift_ptr,
        out_ptr,
        rows,
        channels,
        ROWS: tl.constexpr,
        CH: tl.constexpr,
        HAS_SHIFT: tl.constexpr,
        FAST_SIN: tl.constexpr,
    ):
        channel = tl.arange(0, CH)
        in_channels = channel < channels
        alpha = tl.load(alpha_ptr + channel, mask=in_channels, other=0.0)
        inv_beta = tl.load(inv_beta_ptr + channel, mask=in_channels, other=0.0)
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # b * T + t
        mask = (row < rows)[:, None] & in_channels[None, :]
        offsets = row[:, None] * channels + channel[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            x = x + tl.load(shift_ptr + channel, mask=in_channels, other=0.0)[None, :]
        phase = alpha[None, :] * x
        if FAST_SIN:
            phase = phase - tl.floor(phase * 0.15915494309189535 + 0.5) * 6.283185307179586
            wave = tl.inline_asm_elementwise(
                "sin.approx.f32 $0, $1;", "=r,r", [phase], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            wave = tl.sin(phase)
        y = x + inv_beta[None, :] * wave * wave
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    _TRITON["kernels"] = (snake_ncw, snake_nwc, triton.next_power_of_2)
    return _TRITON["kernels"]


def triton_usable() -> bool:
    """Whether Triton imports here (the kernels are then built)."""
    return _triton_kernels() is not None


def snake_layout(x: torch.Tensor) -> tuple[int, int] | None:
    """(channels, inner stride) when `x` ([B, C, T] or [B, C, 1, T]) is dense in NCW order or
    in channels-last order, else None (the caller makes it contiguous)."""
    channels = x.shape[1]
    if x.is_contiguous():
        return channels, x[0, 0].numel()
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return channels, 1
    return None


def snake_triton(
    x: torch.Tensor,
    alpha32: torch.Tensor,
    inv_beta32: torch.Tensor,
    shift32: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused kernel: one read and one write of x. alpha32 / inv_beta32 (and the optional
    shift32, a folded conv bias: snake(x + shift)): float32 [C]."""
    snake_ncw, snake_nwc, next_power_of_2 = _triton_kernels()
    layout = snake_layout(x)
    if layout is None or (layout[1] != 1 and x.shape[0] * x.shape[1] > _MAX_GRID_ROWS):
        x = x.contiguous()
        layout = snake_layout(x)
        if x.shape[0] * x.shape[1] > _MAX_GRID_ROWS:  # beyond the grid: plain torch
            view = (1, -1) + (1,) * (x.dim() - 2)
            if shift32 is not None:
                x = x + shift32.to(x.dtype).view(view)
            return snake_torch(x, alpha32.to(x.dtype).view(view), inv_beta32.to(x.dtype).view(view))
    channels, inner = layout
    out = torch.empty_like(x)  # keeps x's memory format
    has_shift = shift32 is not None
    fast_sin = SNAKE_FAST_SIN and x.dtype in HALF_DTYPES
    shift = shift32 if has_shift else alpha32  # a placeholder pointer the kernel never reads
    if inner == 1:  # channels-last: [B * T rows, C]
        rows = x.numel() // channels
        width = next_power_of_2(channels)
        elements, warps = SNAKE_NWC_CONFIGS.get(width, SNAKE_NWC_CONFIG)
        per_program = max(1, elements // width)
        grid = (triton_cdiv(rows, per_program),)
        snake_nwc[grid](
            x,
            alpha32,
            inv_beta32,
            shift,
            out,
            rows,
            channels,
            ROWS=per_program,
            CH=width,
            HAS_SHIFT=has_shift,
            FAST_SIN=fast_sin,
            num_warps=warps,
        )
    else:
        block = 2048
        grid = (triton_cdiv(inner, block), x.shape[0] * channels)
        snake_ncw[grid](
            x,
            alpha32,
            inv_beta32,
            shift,
            out,
            channels,
            inner,
            BLOCK=block,
            HAS_SHIFT=has_shift,
            FAST_SIN=fast_sin,
        )
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


_COMPILED: dict[str, Callable] = {}


def compiled_snake() -> Callable:
    """`snake_torch` through torch.compile (one compile, dynamic shapes)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(snake_torch, dynamic=True)
    return _COMPILED["fn"]


# ----------------------------------------------------------------------------- residual unit

_RESIDUAL: dict[str, object] = {}
RESIDUAL_DTYPES = (torch.bfloat16, torch.float16)  # tl.dot inputs; float32 runs the torch path


def _triton_residual_kernel():
    """The fused snake2 -> 1x1 conv -> + bias + residual kernel, or None without Triton.

    Tiles: a program owns rows [BLOCK_M] x output channels [BLOCK_N] and walks the input
    channels in BLOCK_K steps; the 1-D grid runs the BLOCK_N tiles of one row tile next to each
    other, so a layer wider than one tile (C = 512: 2 column tiles) reads its h rows from L2,
    not HBM. Only bf16 / fp16 (tl.dot inputs); float32 runs the torch path."""
    if "kernel" in _RESIDUAL:
        return _RESIDUAL["kernel"]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _RESIDUAL["kernel"] = None
        return None

    @triton.jit
    def snake_linear_residual(
        h_ptr,  # [rows, C] conv1's output without its bias (channels-last [B, C, 1, T])
        x_ptr,  # [rows, C] the unit's input (the residual)
        w_ptr,  # [C_in, C_out] conv2's weight, transposed
        bias_ptr,  # [C] float32, conv2's bias
        alpha_ptr,  # [C] float32, snake2's e^alpha
        inv_beta_ptr,  # [C] float32, snake2's 1 / (e^beta + 1e-9)
        shift_ptr,  # [C] float32, conv1's bias
        out_ptr,  # [rows, C]
        rows,
        channels,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        FAST_SIN: tl.constexpr,
    ):
        col_tiles = channels // BLOCK_N
        pid = tl.program_id(0)
        row = (pid // col_tiles).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        col = (pid % col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = (row < rows)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, channels, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            h = tl.load(h_ptr + row[:, None] * channels + k[None, :], mask=row_ok, other=0.0)
            h = h.to(tl.float32) + tl.load(shift_ptr + k)[None, :]
            phase = tl.load(alpha_ptr + k)[None, :] * h
            if FAST_SIN:
                # the accurate sin (libdevice) is ~half this kernel's time; the hardware one
                # after reducing the phase to [-pi, pi] is within ~1e-6 + |phase| * 2e-7
                phase = phase - tl.floor(phase * 0.15915494309189535 + 0.5) * 6.283185307179586
                wave = tl.inline_asm_elementwise(
                    "sin.approx.f32 $0, $1;",
                    "=r,r",
                    [phase],
                    dtype=tl.float32,
                    is_pure=True,
                    pack=1,
                )
            else:
                wave = tl.sin(phase)
            h = h + tl.load(inv_beta_ptr + k)[None, :] * wave * wave
            w = tl.load(w_ptr + k[:, None] * channels + col[None, :])
            # snake2's output rounded to the model dtype, as the unfused path stores it
            acc = tl.dot(h.to(w.dtype), w, acc)
        offsets = row[:, None] * channels + col[None, :]
        residual = tl.load(x_ptr + offsets, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc + tl.load(bias_ptr + col)[None, :] + residual
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=row_ok)

    _RESIDUAL["kernel"] = snake_linear_residual
    return snake_linear_residual


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by channel count, for the counts that run
# the fused kernel. The tiles come from a one-off GPU sweep whose script was not kept; the
# kernel's rates are in docs/BENCHMARKS.md, row `oobleck-sweep`. Wider layers (C >= 1024,
# a few % of the bytes) run the torch path: cuBLAS's tuned GEMM beats this simple kernel there.
RESIDUAL_TILES: dict[int, tuple[int, int, int, int, int]] = {
    128: (64, 128, 64, 4, 3),
    256: (64, 256, 64, 4, 2),
    512: (128, 256, 64, 8, 3),
}

# The hardware sin after range reduction (within ~1e-6 + |phase| * 2e-7 of the accurate one),
# which bf16 outputs cannot tell apart; `residual_self_check` compares the kernel with the torch
# path at build, and the fused encode's latents stay within bf16 rounding of the unfused ones.
RESIDUAL_FAST_SIN = True


def residual_triton_fits(h: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the fused kernel takes these tensors: same [B, C, 1, T] shape, both dense
    channels-last, a half dtype, C one of `RESIDUAL_TILES` (whole tiles, no channel masks)."""
    return (
        h.is_cuda
        and h.dim() == 4
        and h.shape == x.shape
        and h.dtype == x.dtype
        and h.dtype in RESIDUAL_DTYPES
        and h.shape[1] in RESIDUAL_TILES
        and h.is_contiguous(memory_format=torch.channels_last)
        and x.is_contiguous(memory_format=torch.channels_last)
    )


def snake_linear_residual_triton(
    h: torch.Tensor,
    x: torch.Tensor,
    w_t: torch.Tensor,
    bias32: torch.Tensor,
    alpha32: torch.Tensor,
    inv_beta32: torch.Tensor,
    shift32: torch.Tensor,
) -> torch.Tensor:
    """x + conv2(snake2(h + shift)) for channels-last [B, C, 1, T] h and x (see
    `residual_triton_fits`): one read of h, one of x, one write. Returns a new channels-last
    tensor."""
    kernel = _triton_residual_kernel()
    channels = h.shape[1]
    rows = h.numel() // channels
    block_m, block_n, block_k, warps, stages = RESIDUAL_TILES[channels]
    out = torch.empty_like(x)  # channels-last, as x
    grid = (triton_cdiv(rows, block_m) * (channels // block_n),)
    kernel[grid](
        h,
        x,
        w_t,
        bias32,
        alpha32,
        inv_beta32,
        shift32,
        out,
        rows,
        channels,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        FAST_SIN=RESIDUAL_FAST_SIN,
        num_warps=warps,
        num_stages=stages,
    )
    return out
