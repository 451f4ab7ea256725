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
attention on the `cu_seqlens` song boundaries on CUDA (`torch.nn.attention.varlen`), and elsewhere one
SDPA with the block-diagonal causal mask of those boundaries.

Compile (`compile_layers`): each decoder layer is compiled on its own with static shapes; nothing in a
layer breaks the graph (sdpa, varlen, eager attention; LoRA; activation checkpointing), which
`tests/training/test_lm_compile.py` checks with `torch._dynamo.explain`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hotstep_ray.training import compiling
from hotstep_ray.training.lm_data import MicroBatch
from hotstep_ray.training.lm_vram import DEFAULT_CE_CHUNK

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


@dataclass(frozen=True)
class _FlashVarlen:
    """`varlen_attn` and the keyword arguments this torch's signature takes, worked out once at
    registration: `inspect` and imports inside the attention would break a compiled layer's graph."""

    fn: Callable[..., torch.Tensor]
    extra: dict[str, Any]  # the causal switch (window_size or is_causal), enable_gqa when taken
    has_scale: bool  # takes `scale`
    gqa: bool  # the kernel shares KV heads itself; else they are repeated first


_FLASH: _FlashVarlen | None = None
_FLASH_LOOKED = False  # _FLASH is final (None: this torch has no varlen attention)


def _flash_setup() -> _FlashVarlen | None:
    global _FLASH, _FLASH_LOOKED
    if not _FLASH_LOOKED:
        fn = _flash_varlen()
        if fn is not None:
            params = frozenset(inspect.signature(fn).parameters)
            extra: dict[str, Any] = {}
            if "window_size" in params:
                extra["window_size"] = (-1, 0)  # causal
            else:
                extra["is_causal"] = True
            if "enable_gqa" in params:
                extra["enable_gqa"] = True
            _FLASH = _FlashVarlen(fn, extra, "scale" in params, "enable_gqa" in params)
        _FLASH_LOOKED = True
    return _FLASH


def _flash_for(query: torch.Tensor) -> _FlashVarlen | None:
    """The flash kernel when it applies to `query` (CUDA, fp16/bf16), else None."""
    flash = _FLASH if _FLASH_LOOKED else _flash_setup()
    if flash is None or not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16):
        return None
    return flash


def _segment_mask(cu: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """`[B, 1, T, T]` bool: query t sees key s when both lie in one segment of `cu` (over the
    flattened B·T tokens) and s <= t. Shape-static tensor ops only (no `.tolist()`), so a
    compiled layer keeps one graph whatever the song boundaries are."""
    flat = torch.arange(batch * length, device=cu.device, dtype=cu.dtype)
    segment = torch.bucketize(flat, cu[1:], right=True).view(batch, length)  # [B, T] song index
    same = segment[:, :, None] == segment[:, None, :]  # [B, T, T]
    causal = torch.ones(length, length, dtype=torch.bool, device=cu.device).tril()
    return (same & causal)[:, None]


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
    without it every row is one segment. Returns `[B, T, Hq, D]` as transformers expects.

    CUDA bf16/fp16: flash varlen on the segments. Elsewhere one SDPA over the rows with the
    block-diagonal causal mask of the segments (`_segment_mask`, O(B·T²) bool)."""
    batch, heads, length, dim = query.shape
    flash = _flash_for(query)
    if flash is not None:
        if cu_seq_lens_q is None:
            cu_seq_lens_q = torch.arange(
                0, (batch + 1) * length, length, dtype=torch.int32, device=query.device
            )
        cu = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
        q = query.transpose(1, 2).reshape(batch * length, heads, dim)  # [N, Hq, D]
        k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)  # [N, Hkv, D]
        v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
        if not flash.gqa and k.shape[1] != heads:
            k = k.repeat_interleave(heads // k.shape[1], dim=1)
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        extra = {**flash.extra, "scale": scaling} if flash.has_scale else flash.extra
        # The kernel sizes its grid by the longest segment. A compiled layer takes the row width
        # T instead (no segment outgrows its row; the extra blocks exit at once): the exact
        # maximum changes from batch to batch and would cost a recompile for every new value.
        if torch.compiler.is_compiling():
            max_len = length  # `max_length_q` is not read: no guard on its value either
        else:
            max_len = int(max_length_q or length)
        out = flash.fn(q, k, v, cu, cu, max_len, max_len, **extra)
        return out.reshape(batch, length, heads, dim), None
    mask = None
    if cu_seq_lens_q is not None:
        mask = _segment_mask(cu_seq_lens_q.to(query.device), batch, length)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=mask is None,
        scale=scaling,
        enable_gqa=key.shape[1] != heads,
    )  # [B, Hq, T, D]
    return out.transpose(1, 2), None


def register_varlen_attention() -> str:
    """Register `hotstep_varlen` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    _flash_setup()
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


# -- torch.compile of the decoder layers ---------------------------------------------------------
COMPILE_MODES = compiling.COMPILE_MODES
# Row widths round up to this many tokens when the layers are compiled (`LmEngine.pad_multiple` 0):
# every new [R, T] is a new graph (dynamic=False), so a 1000-3000-token dataset has at most 32
# widths instead of one per song; the padding costs < 64 tokens per row (< 4 % of a 1700-token song).
COMPILE_PAD_MULTIPLE = 64
# Graphs one code object (`Module._call_impl`, shared by all compiled layers) may hold before
# dynamo silently runs it eagerly: per row shape, up to three variants (layer 0, whose input
# needs no grad; checkpointed; plain), times the songs per micro-batch under varlen.
RECOMPILE_LIMIT = 256


def compile_layers(layers: Sequence[nn.Module], mode: str, backend: Any = "inductor") -> None:
    """`torch.compile` each decoder layer in place with static shapes (Inductor fuses the RMS
    norms, rotary, SiLU·up and the LoRA adds around the GEMMs). The layers share their graphs.
    Activation checkpointing stays in the layer (transformers' checkpointing `forward`), so the
    checkpoint is traced into the graph and the compiled backward recomputes it. `backend` other
    than inductor (tests): dynamo + that backend, `mode` ignored."""
    compiling.compile_each(layers, mode, backend, RECOMPILE_LIMIT)


def uncompile_layers(layers: Sequence[nn.Module]) -> None:
    """Back to the eager layers (their compiled code stays in dynamo's cache until a reset)."""
    for layer in layers:
        layer._compiled_call_impl = None


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
