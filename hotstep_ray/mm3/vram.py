"""How much GPU memory one MM3 DiT LoRA training worker needs: the Ray `VRAM_GB` request.

    peak = frozen DiT weights                     params x 2 B (bf16) or 4 B (float32)
         + LoRA                                   lora params x 16 B (fp32 value, grad, 2 AdamW moments)
         + activations                            batch x crop latents x bytes per latent
    request = ceil((peak + reserve) / 1 GB)

Measured anchor (docs/BENCHMARKS.md, `bench/mm3_bench.py`, H200, bf16 base, r32 on the 8 sites,
batch 1, eager SDPA, peak ALLOCATED): 8.10 GiB at 689 latents and 10.96 GiB at 1378 without
gradient checkpointing; 5.59 / 5.64 GiB with it. The difference of the two crops gives the
per-latent cost (2.86 GiB / 689 latents = 4.35 MB per latent, full depth; 0.07 GiB / 689 =
0.11 MB with checkpointing), and the intercept (8.10 - 2.86 = 5.24 GiB) agrees with the
weights + LoRA terms computed here (4.53 + 0.78 = 5.31 GiB) within 2 %. Activation bytes scale
with depth x width, so other shapes (the tiny test model) take the anchor per layer-channel.

The C++ seed's 20.4 / 31.8 GB at 689 / 1378 on an RTX 5090 are NOT the fit: its graph runs f32
with a materialised attention matrix (36 blocks x 32 heads x S^2 x 4 B is 2.2 GB at S = 690 and
8.7 GB at S = 1378; hotstep.md §7.5), which PyTorch's SDPA never stores. They are the ceiling the
estimate must stay under (a test checks it). Allocator slack (reserved - allocated: 1.7 GiB at
689 in the bench) is what `vram_reserve_mb` covers.
"""

from __future__ import annotations

import math
from typing import Any

GB = 1e9
GIB = 1024**3
# Anchor: released DiT shape (36 blocks x 2048 channels) and its measured per-latent bytes.
ANCHOR_LAYERS, ANCHOR_DIM = 36, 2048
ACTIVATION_BYTES_PER_LATENT = (10.96 - 8.10) * GIB / 689  # full depth, no checkpointing
CHECKPOINTED_BYTES_PER_LATENT = (5.64 - 5.59) * GIB / 689  # with gradient checkpointing
CHECKPOINTED_BLOCK_BYTES = 0.28 * GIB  # one block recomputed at a time (5.59 - 5.31 GiB at 689)
LORA_BYTES_PER_PARAM = 16  # fp32 value + grad + AdamW exp_avg + exp_avg_sq
# Seed figures (C++ GGML, f32, materialised attention): an upper bound, not the fit.
SEED_PEAK_GB = {689: 20.4, 1378: 31.8}


def dit_shape(config: dict[str, Any]) -> dict[str, int]:
    """Layers, width, FFN width and I/O widths of a diffusers MM3 DiT config (released
    defaults where a key is missing)."""
    heads = int(config.get("num_attention_heads", 32))
    dim = heads * int(config.get("attention_head_dim", 64))
    return {
        "layers": int(config.get("num_layers", 36)),
        "dim": dim,
        "ff_inner": int(config.get("ff_inner_dim", 4 * dim)),
        "in_channels": int(config.get("in_channels", 128)),
        "condition_dim": int(config.get("condition_dim", 2048)),
    }


def dit_params(shape: dict[str, int], fourier_dim: int = 256) -> int:
    """Parameter count of the MM3 DiT (2,431,905,920 for the release; tests pin it)."""
    d, ff, c = shape["dim"], shape["ff_inner"], shape["in_channels"]
    wide = 2 * c + shape["condition_dim"]  # concat[x, zeros, condition]
    block = (
        4 * d * d  # to_q, to_k, to_v, to_out.0 (no bias)
        + (d * 2 * ff + 2 * ff)  # ff_in: value | gate, with bias
        + (ff * d + d)  # ff_out, with bias
        + 2 * 2 * d  # norm1, norm2 (LayerNorm weight + bias)
    )
    stem = (
        fourier_dim // 2  # time_proj Fourier weights
        + (fourier_dim * d + d)  # time_embed.linear_1
        + (d * d + d)  # time_embed.linear_2
        + wide * wide  # preprocess_conv 1x1, no bias
        + wide * d  # proj_in
        + d * c  # proj_out
        + c * c  # postprocess_conv 1x1
    )
    return shape["layers"] * block + stem


def lora_params(shape: dict[str, int], rank: int) -> int:
    """LoRA parameters on all eight MM3 sites: r x (in + out) per adapted Linear."""
    d, ff = shape["dim"], shape["ff_inner"]
    wide = 2 * shape["in_channels"] + shape["condition_dim"]
    per_block = 4 * (d + d) + (d + 2 * ff) + (ff + d)
    return rank * (shape["layers"] * per_block + (wide + d) + (d + shape["in_channels"]))


def activation_bytes(shape: dict[str, int], latents: int, checkpointing: bool) -> float:
    """Bytes kept for backward for `latents` latent positions (one crop x batch)."""
    scale = shape["layers"] * shape["dim"] / (ANCHOR_LAYERS * ANCHOR_DIM)
    if checkpointing:
        block = CHECKPOINTED_BLOCK_BYTES * shape["dim"] / ANCHOR_DIM * latents / 689
        return scale * CHECKPOINTED_BYTES_PER_LATENT * latents + block
    return scale * ACTIVATION_BYTES_PER_LATENT * latents


def peak_bytes(
    config: dict[str, Any],
    *,
    rank: int,
    crop_latents: int,
    batch: int = 1,
    base_dtype: str = "bfloat16",
    checkpointing: bool = False,
) -> float:
    """Predicted peak allocated bytes of one training worker (see the module docstring)."""
    shape = dit_shape(config)
    weight_bytes = 2 if base_dtype == "bfloat16" else 4
    return (
        dit_params(shape, int(config.get("fourier_embedding_dim", 256))) * weight_bytes
        + lora_params(shape, rank) * LORA_BYTES_PER_PARAM
        + activation_bytes(shape, batch * crop_latents, checkpointing)
    )


def request_gb(config: dict[str, Any], options: Any) -> int:
    """Whole GB per worker for `Mm3TrainOptions` `options`: the peak plus `vram_reserve_mb`."""
    need = peak_bytes(
        config,
        rank=options.rank,
        crop_latents=options.crop_latents,
        batch=options.batch,
        base_dtype=options.dtype,
        checkpointing=options.gradient_checkpointing,
    )
    return max(1, math.ceil((need + options.vram_reserve_mb * 1e6) / GB))
