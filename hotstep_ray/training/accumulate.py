"""Gradient accumulation by element share, and the masked per-sample MSE it weights.

An optimizer window holds `grad_accum` micro-batches of up to `batch` samples each; the last one of
an epoch can be short. Each micro-batch loss is already a mean over its own samples
(`masked_mse`), so weighting it by `n_mb / n_window` (its share of the window's samples) makes

    Σ_mb (n_mb / n_window) · mean_{i ∈ mb} ℓ_i  =  (1 / n_window) · Σ_{i ∈ window} ℓ_i,

Side-Step's global mean of per-sample means over the window. The naive `1 / n_micro_batches`
agrees only while every micro-batch is full; a short tail of `n < B` samples is over-weighted
by `B / n`. At batch 1 the two forms are identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def micro_batch_weights(samples_per_micro_batch: Sequence[int]) -> list[float]:
    """Weight of each micro-batch's loss: its sample count over the window's sample count (the
    "elements" of the share are samples, each already a mean over its valid frames)."""
    counts = [int(n) for n in samples_per_micro_batch]
    if not counts or any(n < 0 for n in counts) or sum(counts) == 0:
        raise ValueError(f"need non-negative counts with a positive total, got {counts}")
    total = sum(counts)
    return [n / total for n in counts]


def masked_mse(
    pred: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    element_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over samples of each sample's mean squared error over its valid elements.

    pred/target `[B, T, ...]`; mask `[B, T]` (or any shape broadcastable to pred's leading dims),
    true/1 = valid frame — padding contributes nothing and does not dilute the mean; weights `[B]`
    per-sample loss weights (e.g. flow-SNR w_i / w̄); element_weights broadcastable to pred
    (e.g. channel balance `[C]`). Returns a 0-dim tensor in float32 or wider.
    """
    dtype = torch.promote_types(pred.dtype, torch.float32)
    err = (pred.to(dtype) - target.to(dtype)).square()
    if element_weights is not None:
        err = err * element_weights.to(dtype)
    batch = err.shape[0]
    if mask is None:
        per_sample = err.reshape(batch, -1).mean(dim=1)
    else:
        mask = mask.to(dtype)
        mask = mask.reshape(*mask.shape, *([1] * (err.ndim - mask.ndim))).expand_as(err)
        valid = mask.reshape(batch, -1).sum(dim=1)
        per_sample = (err * mask).reshape(batch, -1).sum(dim=1) / valid.clamp(min=1)
    if weights is not None:
        per_sample = per_sample * weights.to(dtype)
    return per_sample.mean()
