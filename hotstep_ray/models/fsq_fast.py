"""5 Hz audio codes at reduced-precision speed, equal to the float32 tokenizer's codes.

The audio tokenizer pools each 5-frame window of 25 Hz latents on its own (the pooler reshapes to
[B * T5, 1 + 5 tokens]; nothing crosses windows), projects it to 6 FSQ dims and floors
`bracket = (L - 1) * (clamp(z, -1, 1) + 1) / 2 + 0.5` per dim (levels L = [8, 8, 8, 5, 5, 5]).
A code can only differ between two precisions where some dim's bracket sits near an integer
(a floor boundary). So:

1. pass 1 runs the projection and pooler in TF32 (CUDA) or bf16 autocast, then the FSQ in float32
   through diffusers' own quantizer, and measures each window's margin: the distance of its
   brackets to the nearest integer, in level units (min over the 6 dims);
2. pass 2 reruns every window whose margin is below `margin` through the plain float32 tokenizer
   and overwrites its code.

Pass 2 equals the full float32 run as long as pass 1's bracket error stays below `margin`
(`bench/preprocess_bench.py` reports the largest as `codes_max_level_error`). Float32
itself is only reproducible up to rounding across batch shapes (a window recomputed in a batch
of n may round its last bit differently), the same noise the existing grouping of songs into
tokenizer calls already has.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.pipelines.ace_step import AceStepAudioTokenizer

from hotstep_ray.core.precision import tf32_matmuls
from hotstep_ray.models.acestep_wrappers import pad_to_window, tokenize_latents

FAST_PASSES: tuple[str, ...] = ("off", "tf32", "bf16")


def resolve_fast_pass(setting: str, device: torch.device) -> str:
    """The pass to run: "auto" -> "tf32" on CUDA, "off" elsewhere; "tf32" off CUDA is refused
    (no TF32 there)."""
    device = torch.device(device)
    if setting == "auto":
        return "tf32" if device.type == "cuda" else "off"
    if setting not in FAST_PASSES:
        raise ValueError(f"codes fast pass must be auto or one of {FAST_PASSES}, got {setting!r}")
    if setting == "tf32" and device.type != "cuda":
        raise ValueError(f"codes fast pass 'tf32' needs a CUDA device, not {device}")
    return setting


def reduced_precision(mode: str, device: torch.device) -> AbstractContextManager[object]:
    """Pass 1's precision. "bf16": autocast on the device type. "tf32": float32 tensors, TF32
    tensor-core matmuls and cuDNN convs (`core.precision.tf32_matmuls`)."""
    if mode == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    if mode == "tf32":
        return tf32_matmuls()
    raise ValueError(f"reduced precision is tf32 or bf16, not {mode!r}")


def fsq_brackets(quantizer: torch.nn.Module, pooled: torch.Tensor) -> torch.Tensor:
    """[..., H] pooled states -> [..., D] float32 brackets of the first (scale 1) quantizer,
    diffusers' `_AceStepResidualFSQ` formula step by step: code level = floor(bracket)."""
    bias = quantizer.project_in.bias
    z = F.linear(
        pooled.float(),
        quantizer.project_in.weight.float(),
        None if bias is None else bias.float(),
    )
    levels = quantizer._levels.to(device=z.device, dtype=z.dtype)
    soft_clamp = 1.0 + 1.0 / (levels - 1.0)
    z = (z / soft_clamp).tanh() * soft_clamp
    return (levels - 1.0) * (z.clamp(-1.0, 1.0) + 1.0) / 2.0 + 0.5


def boundary_margin(brackets: torch.Tensor) -> torch.Tensor:
    """[..., D] brackets -> [...] min over dims of the distance to the nearest integer (the
    floor boundaries), in level units: 0 = on a boundary, 0.5 = as far as can be."""
    return (brackets - brackets.round()).abs().amin(dim=-1)


def _windows(
    tokenizer: AceStepAudioTokenizer, latents: torch.Tensor, silence_latent: torch.Tensor
) -> torch.Tensor:
    """[B, T, C] -> [B, T5, 5, C] silence-padded 5-frame windows."""
    window = tokenizer.pool_window_size
    padded = pad_to_window(latents, silence_latent, window)
    batch, frames, channels = padded.shape
    return padded.reshape(batch, frames // window, window, channels)


def _pooled(tokenizer: AceStepAudioTokenizer, windows: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, T5, 5, C] -> [B, T5, H] float32 pooler output, under `mode` ("off" = plain)."""
    if mode == "off":
        pooled = tokenizer.attention_pooler(tokenizer.audio_acoustic_proj(windows))
    else:
        with reduced_precision(mode, windows.device):
            pooled = tokenizer.attention_pooler(tokenizer.audio_acoustic_proj(windows))
    return pooled.float()


@torch.no_grad()
def window_brackets(
    tokenizer: AceStepAudioTokenizer,
    latents: torch.Tensor,
    silence_latent: torch.Tensor,
    mode: str,
) -> torch.Tensor:
    """[B, T, C] latents -> [B, T5, D] float32 brackets with pass 1 run under `mode` ("off" =
    float32). The bench compares modes: max |bracket_fast - bracket_fp32| is the level error the
    recheck margin must exceed."""
    return fsq_brackets(
        tokenizer.quantizer, _pooled(tokenizer, _windows(tokenizer, latents, silence_latent), mode)
    )


@dataclass
class FastCodes:
    indices: torch.Tensor  # [B, T5, 1] int32, as `tokenize_latents(...).indices`
    windows: int  # B * T5
    # windows recomputed in float32: 0 for mode "off", all of them for residual quantizers
    rechecked: int


@torch.no_grad()  # integer codes: nothing to differentiate
def fast_codes(
    tokenizer: AceStepAudioTokenizer,
    latents: torch.Tensor,
    silence_latent: torch.Tensor,
    mode: str,
    margin: float,
) -> FastCodes:
    """[B, T, C] float32 latents -> the float32 tokenizer's codes via the two passes (module
    doc). `silence_latent` [1, N, C] pads T to a multiple of 5 as `tokenize_latents` does; the
    frame mask only shapes `tokenize_latents`' pooled mask, never the codes, so it is not taken.
    `mode`: "off" (plain float32), "tf32" or "bf16"; `margin` in level units (0 = no recheck)."""
    return fast_codes_many(tokenizer, [latents], silence_latent, mode, margin)[0]


@torch.no_grad()
def fast_codes_many(
    tokenizer: AceStepAudioTokenizer,
    groups: list[torch.Tensor],
    silence_latent: torch.Tensor,
    mode: str,
    margin: float,
    recheck_windows: int = 0,
) -> list[FastCodes]:
    """`fast_codes` of several tokenizer calls ([B_i, T_i, C] latents each) with one recheck
    for all of them: pass 1 runs call by call (its activations bound the memory), then the
    windows near a boundary, gathered across calls, run through the float32 tokenizer in
    chunks of at most `recheck_windows` (0 = one chunk). One sync for the whole set (the count
    of windows to recheck) instead of three per call."""
    window = tokenizer.pool_window_size
    quantizer = tokenizer.quantizer
    totals = [g.shape[0] * -(-g.shape[1] // window) for g in groups]  # B * T5 per call
    if mode == "off" or quantizer.num_quantizers != 1:
        # Residual levels (scale < 1) quantize what pass 1's error left over, so a margin on the
        # first level's brackets bounds nothing: everything in float32 (all "rechecked").
        return [
            FastCodes(
                tokenize_latents(tokenizer, g, silence_latent).indices,
                total,
                0 if mode == "off" else total,
            )
            for g, total in zip(groups, totals, strict=True)
        ]
    found, flat_windows, flat_redo = [], [], []
    for latents in groups:
        windows = _windows(tokenizer, latents, silence_latent)  # [B, T5, 5, C]
        pooled = _pooled(tokenizer, windows, mode)  # [B, T5, H]
        _, indices = quantizer(pooled)  # float32 FSQ, diffusers' code: [B, T5, 1] int64
        margins = boundary_margin(fsq_brackets(quantizer, pooled))  # [B, T5]
        found.append(indices)
        flat_windows.append(windows.reshape(-1, *windows.shape[2:]))  # [B * T5, 5, C]
        flat_redo.append(~(margins >= margin).reshape(-1))  # NaN margins are rechecked too
    counts = torch.stack([mask.sum() for mask in flat_redo])  # per call, queued before ...
    redo = torch.cat(flat_redo).nonzero().squeeze(1)  # ... the one sync that waits for pass 1
    rechecked = counts.tolist()  # already computed: no further wait
    codes = torch.cat([indices.reshape(-1) for indices in found])  # [sum B * T5] int64
    if redo.numel():
        every_window = torch.cat(flat_windows)
        chunk = recheck_windows if recheck_windows > 0 else redo.numel()
        for first in range(0, redo.numel(), chunk):
            rows = redo[first : first + chunk]
            _, exact = tokenizer.tokenize(every_window.index_select(0, rows))  # [n, 1, 1]
            codes.index_copy_(0, rows, exact.reshape(-1).to(codes.dtype))
    out, offset = [], 0
    for indices, total, count in zip(found, totals, rechecked, strict=True):
        part = codes[offset : offset + total].reshape(indices.shape)
        out.append(FastCodes(part.to(torch.int32), total, count))
        offset += total
    return out
