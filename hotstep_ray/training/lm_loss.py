"""The LM loss without full-vocab logits: body once, head chunk by chunk, attention per song.

The 5 Hz LM's head is the tied 217,204 x H embedding. Plain `model(...).logits` holds `[T, V]`
float32 logits for the whole sequence (1700 tokens: 1.4 GB, plus as much again for their gradient).
Here the body (`model.model`) runs once; only the M target positions are projected, `chunk` rows at
a time. The head is frozen (LoRA/LoKR never touch it), so each chunk's gradient with respect to
the hidden states is known in the forward pass:

    p = softmax(h·Wᵀ);  ∂(w·CE)/∂h = w·(p − onehot(y))·W      h [C, H], W [V, H], p [C, V]

`_FusedHeadCE` computes loss and that gradient per chunk and keeps only `[M, H]`: the same two
GEMMs per chunk as forward + backward of the plain head (no recompute), peak `chunk x V`. A
trainable head falls back to per-chunk activation checkpointing (three GEMMs per chunk).

Attention. `sdpa` (default) lets transformers build a block-diagonal causal mask from the position
ids that restart per song; `varlen` (registered here as `hotstep_varlen`) runs flash varlen
attention on the `cu_seqlens` song boundaries on CUDA (`torch.nn.attention.varlen`), and one causal
SDPA per song elsewhere.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hotstep_ray.training.lm_data import MicroBatch

DEFAULT_CE_CHUNK = 512  # target rows per head chunk: 512 x 217,204 logits = 0.67 GB (bf16 + fp32)
VARLEN_ATTENTION = "hotstep_varlen"
ATTENTIONS = ("sdpa", "varlen", "flex_attention", "eager")


# -- cross-entropy over a frozen head ------------------------------------------------------------
class _FusedHeadCE(torch.autograd.Function):
    """Σ_m w_m·CE(h_m·Wᵀ, y_m) with ∂/∂h computed chunk by chunk in the forward."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,  # [M, H]
        weight: torch.Tensor,  # [V, H], frozen
        targets: torch.Tensor,  # [M] long
        weights: torch.Tensor,  # [M] float32
        chunk: int,
    ) -> torch.Tensor:
        need_grad = ctx.needs_input_grad[0]
        h_all = hidden.to(weight.dtype)
        grad = torch.empty_like(h_all) if need_grad else None
        acc = _accumulation_dtype(weight)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, h_all.shape[0], chunk):
            end = min(start + chunk, h_all.shape[0])
            logits = (h_all[start:end] @ weight.T).to(acc)  # [C, V]
            y, w = targets[start:end], weights[start:end].to(acc)
            lse = torch.logsumexp(logits, dim=-1)  # [C]
            picked = logits.gather(1, y[:, None]).squeeze(1)  # [C]
            total += ((lse - picked) * w).sum()
            if grad is not None:
                probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                probs[torch.arange(end - start, device=probs.device), y] -= 1.0
                probs.mul_(w[:, None])
                grad[start:end] = probs.to(weight.dtype) @ weight  # [C, H]
        ctx.hidden_dtype = hidden.dtype
        ctx.save_for_backward(grad if grad is not None else torch.empty(0))
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor):
        (grad,) = ctx.saved_tensors
        grad_hidden = (grad * grad_total.to(grad.dtype)).to(ctx.hidden_dtype)
        return grad_hidden, None, None, None, None


def _accumulation_dtype(weight: torch.Tensor) -> torch.dtype:
    """float32 for bf16/fp16/fp32 heads, float64 for a float64 one."""
    return torch.promote_types(weight.dtype, torch.float32)


def _chunk_ce(hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    acc = _accumulation_dtype(weight)
    logits = (hidden.to(weight.dtype) @ weight.T).to(acc)
    return (F.cross_entropy(logits, y, reduction="none") * w.to(acc)).sum()


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor | None = None,
    chunk: int = DEFAULT_CE_CHUNK,
) -> torch.Tensor:
    """Σ_m weights_m · CE(hidden_m·weightᵀ, targets_m), 0-dim, float32 (float64 for a float64
    head); never more than
    `chunk` rows of logits alive. hidden [M, H], weight [V, H], targets [M], weights [M] (default 1).
    Equals `plain_cross_entropy` in value and gradient."""
    if weights is None:
        weights = torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0
    if not weight.requires_grad:
        return _FusedHeadCE.apply(hidden, weight, targets, weights, chunk)
    total = hidden.new_zeros((), dtype=_accumulation_dtype(weight))
    for start in range(0, hidden.shape[0], chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(
            _chunk_ce, hidden[part], weight, targets[part], weights[part], use_reentrant=False
        )
    return total


def plain_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference: full `[M, V]` logits, `F.cross_entropy`, weighted sum."""
    if weights is None:
        weights = torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
    return _chunk_ce(hidden, weight, targets, weights)


# -- attention per song --------------------------------------------------------------------------
def _flash_varlen() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def flash_varlen_available() -> bool:
    """Whether this torch has `torch.nn.attention.varlen` (flash varlen attention on CUDA)."""
    return _flash_varlen() is not None


@functools.cache
def _varlen_params() -> frozenset[str]:
    fn = _flash_varlen()
    return frozenset(inspect.signature(fn).parameters) if fn is not None else frozenset()


def varlen_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # [B, Hq, T, D]
    key: torch.Tensor,  # [B, Hkv, T, D]
    value: torch.Tensor,  # [B, Hkv, T, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention inside each segment of `cu_seq_lens_q` (over the flattened B·T tokens);
    without it every row is one segment. Returns `[B, T, Hq, D]` as transformers expects."""
    batch, heads, length, dim = query.shape
    if cu_seq_lens_q is None:
        cu_seq_lens_q = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32)
        max_length_q = length
    cu = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)  # [N, Hq, D]
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)  # [N, Hkv, D]
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    flash = _flash_varlen()
    if query.is_cuda and flash is not None and query.dtype in (torch.float16, torch.bfloat16):
        params = _varlen_params()
        extra: dict[str, Any] = {"scale": scaling} if "scale" in params else {}
        if "window_size" in params:
            extra["window_size"] = (-1, 0)  # causal
        else:
            extra["is_causal"] = True
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        elif k.shape[1] != heads:
            k = k.repeat_interleave(heads // k.shape[1], dim=1)
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        max_len = int(max_length_q or length)
        out = flash(q, k, v, cu, cu, max_len, max_len, **extra)
    else:
        bounds = cu.tolist()
        pieces = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            seg = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1)[None],  # [1, Hq, L, D]
                k[start:end].transpose(0, 1)[None],
                v[start:end].transpose(0, 1)[None],
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            pieces.append(seg[0].transpose(0, 1))  # [L, Hq, D]
        out = torch.cat(pieces)
    return out.reshape(batch, length, heads, dim), None


def register_varlen_attention() -> str:
    """Register `hotstep_varlen` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    return VARLEN_ATTENTION


def set_attention(model: nn.Module, attention: str) -> None:
    """Switch a transformers model's attention implementation (`sdpa`, `varlen`, …)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    name = register_varlen_attention() if attention == "varlen" else attention
    model.config._attn_implementation = name


def set_layer_checkpointing(layers: Sequence[nn.Module], count: int) -> None:
    """Activation checkpointing on the first `count` decoder layers (0 = none, all = full):
    their inputs are kept, everything inside is recomputed in the backward pass."""
    recompute = functools.partial(checkpoint, use_reentrant=False)
    for index, layer in enumerate(layers):
        on = index < count
        layer.gradient_checkpointing = on
        if on:
            layer._gradient_checkpointing_func = recompute


# -- the training loss ---------------------------------------------------------------------------
class LmLossModule(nn.Module):
    """`forward(batch tensors) -> Σ_songs mean CE` of one micro-batch. A module (not a function)
    so DDP sees the forward and synchronises the adapter gradients."""

    def __init__(self, lm: nn.Module, chunk: int = DEFAULT_CE_CHUNK) -> None:
        super().__init__()
        self.lm = lm  # a transformers causal LM: `.model` body + output embeddings
        self.chunk = chunk

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        pred_index: torch.Tensor,
        target_ids: torch.Tensor,
        target_weight: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if self.lm.config._attn_implementation == VARLEN_ATTENTION and cu_seqlens is not None:
            kwargs = {
                "cu_seq_lens_q": cu_seqlens,
                "cu_seq_lens_k": cu_seqlens,
                "max_length_q": max_seqlen,
                "max_length_k": max_seqlen,
            }
        body = self.lm.model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs
        )
        hidden = body.last_hidden_state  # [R, T, H]
        states = hidden.reshape(-1, hidden.shape[-1]).index_select(0, pred_index)  # [M, H]
        head = self.lm.get_output_embeddings().weight  # [V, H]
        return chunked_cross_entropy(states, head, target_ids, target_weight, self.chunk)


def batch_loss(module: nn.Module, batch: MicroBatch) -> torch.Tensor:
    """Σ_songs mean CE of a (device-resident) micro-batch through `LmLossModule` or its DDP wrap."""
    return module(
        batch.input_ids,
        batch.position_ids,
        batch.pred_index,
        batch.target_ids,
        batch.target_weight,
        batch.cu_seqlens,
        batch.max_seqlen,
    )


def reference_loss(lm: nn.Module, batch: MicroBatch) -> torch.Tensor:
    """The same quantity through the model's own forward with full logits, one song at a time
    (no packing, no chunking): what the fast path must equal."""
    total = torch.zeros((), dtype=torch.float32)
    flat_ids = batch.input_ids.flatten()
    bounds = batch.cu_seqlens.tolist()
    pred = batch.pred_index.tolist()
    for start, length in zip(bounds[:-1], batch.doc_lengths, strict=True):
        ids = flat_ids[start : start + length][None]
        logits = lm(input_ids=ids, use_cache=False).logits[0].float()  # [L, V]
        rows = [i for i, p in enumerate(pred) if start <= p < start + length]
        local = torch.tensor([pred[i] - start for i in rows])
        ce = F.cross_entropy(logits[local], batch.target_ids[rows], reduction="none")
        total = total + (ce * batch.target_weight[rows]).sum()
    return total
