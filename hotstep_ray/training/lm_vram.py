"""Memory and FLOPs of LM adapter training, from the model's config (never its name).

Peak allocated memory of one training step on a frozen bf16 Qwen3 with a LoRA/LoKR adapter:

    weights      params · 2 B (bf16; tied head counted once)
    adapter      n · (4 fp32 master + 4 grad + optimizer state + 2 bf16 autocast copy) B
    activations  per token: kept layers · saved(layer) + checkpointed layers · H, ×2 B
                 + one layer's saved set again (the recompute / backward working set)
    head         chunk · V · (2 bf16 + 4 fp32) B of logits + 2 · M · H · 2 B (states, their grad)

saved(layer), in elements per token, is what autograd keeps when only activations need gradients
(frozen base: no weight gradients, so a Linear keeps only its input when its LoRA needs it):
residual in/out 2H, the two norm outputs 2H, q/k before and after RoPE 2(Dq + Dkv), v Dkv,
attention output Dq, gate, up, silu(gate) and the down input 4I. Allocator slack, the CUDA context
and cuBLAS workspaces are not in the estimate: `fit` subtracts `reserve` from the device first.

FLOPs use the formula of `shared/reference/lm-vae-baseline.md` so MFU compares:
fwd_lin = bwd_lin = 2·N·P_lin, head = 4·M·V·H (M projected targets; the baseline projects all N),
attention 3 · n·4·Dq·Σ L(L+1)/2 (causal pairs per song), LoRA 3 · n·2·N·r·Σ(in + out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hotstep_ray.core.errors import InputError

GIB = 1024**3
MIB = 1024**2
# (hidden, layers) -> size label of the ACE-Step 1.5 LMs (acestep15.md §2.8).
KNOWN_SIZES: dict[tuple[int, int], str] = {(1024, 28): "0.6B", (2048, 28): "1.7B", (2560, 36): "4B"}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPTIMIZER_STATE_BYTES = {"adamw": 8, "muon": 4}  # per adapter parameter (fp32 moments / momentum)

# Target rows per head chunk of the loss (`lm_loss`): 512 x 217,204 logits = 0.67 GB (bf16 + fp32).
DEFAULT_CE_CHUNK = 512


@dataclass(frozen=True)
class LmDims:
    """The shape numbers of a Qwen3 causal LM."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_config(cls, config: Any) -> LmDims:
        """From a transformers config object or a `config.json` dict."""
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(
            hidden=hidden,
            layers=int(get("num_hidden_layers")),
            heads=heads,
            kv_heads=int(get("num_key_value_heads", heads)),
            head_dim=int(get("head_dim", None) or hidden // heads),
            intermediate=int(get("intermediate_size")),
            vocab=int(get("vocab_size")),
            tied=bool(get("tie_word_embeddings", True)),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def size_label(self) -> str | None:
        return KNOWN_SIZES.get((self.hidden, self.layers))

    def projections(self) -> dict[str, tuple[int, int]]:
        """Projection name -> (in_features, out_features) of one decoder layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def linear_params_per_layer(self) -> int:
        return sum(a * b for a, b in self.projections().values())

    @property
    def params(self) -> int:
        norms = 2 * self.hidden + 2 * self.head_dim  # two RMSNorms + q_norm, k_norm
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (self.linear_params_per_layer + norms) + embed + self.hidden

    def saved_per_token(self) -> int:
        """Elements autograd keeps per token in one non-checkpointed layer (module docstring)."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return 4 * h + 2 * (q + kv) + kv + q + 4 * i

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "size": self.size_label}


def adapter_params(
    dims: LmDims,
    kind: str = "lora",
    rank: int = 16,
    factor: int = -1,
    decompose_both: bool = False,
    targets: Sequence[str] = PROJECTIONS,
) -> int:
    """Trainable parameters of a LoRA (r·(in + out) per projection) or LoKR (its factor shapes)."""
    total = 0
    for name in targets:
        fan_in, fan_out = dims.projections()[name]
        if kind == "lora":
            total += rank * (fan_in + fan_out)
            continue
        from hotstep_ray.training.adapters import AdapterSpec, lokr_shape

        spec = AdapterSpec(kind="lokr", rank=rank, factor=factor, decompose_both=decompose_both)
        s = lokr_shape(fan_in, fan_out, spec)
        w1 = s.out_l * s.in_m if s.w1_full else rank * (s.out_l + s.in_m)
        w2 = s.out_k * s.in_n if s.w2_full else rank * (s.out_k + s.in_n)
        total += w1 + w2
    return total * dims.layers


@dataclass(frozen=True)
class VramEstimate:
    """Predicted peak allocated bytes of one step, by part."""

    weights: int
    adapter: int
    activations: int
    head: int
    tokens: int  # tokens in one micro-batch (rows x width)
    checkpointed_layers: int

    @property
    def total(self) -> int:
        return self.weights + self.adapter + self.activations + self.head

    def to_dict(self) -> dict[str, Any]:
        mib = {k: round(v / MIB) for k, v in asdict(self).items() if k not in _COUNTS}
        return {**mib, "total": round(self.total / MIB), "unit": "MiB", **_counts(self)}


_COUNTS = ("tokens", "checkpointed_layers")


def _counts(estimate: VramEstimate) -> dict[str, int]:
    return {k: getattr(estimate, k) for k in _COUNTS}


def estimate_vram(
    dims: LmDims,
    tokens: int,
    *,
    checkpointed_layers: int = 0,
    adapter_parameters: int = 0,
    targets: int | None = None,
    ce_chunk: int = DEFAULT_CE_CHUNK,
    optimizer: str = "muon",
    weight_bytes: int = 2,
    activation_bytes: int = 2,
) -> VramEstimate:
    """Peak memory of a step over `tokens` tokens (rows x width) of which `targets` (default all)
    are projected by the head, with the first `checkpointed_layers` layers recomputed."""
    ckpt = min(max(checkpointed_layers, 0), dims.layers)
    targets = tokens if targets is None else targets
    per_layer = dims.saved_per_token() * activation_bytes * tokens
    boundary = dims.hidden * activation_bytes * tokens
    kept = (dims.layers - ckpt) * per_layer + ckpt * boundary
    working = per_layer + 2 * dims.hidden * activation_bytes * tokens  # embeddings + final norm
    state = OPTIMIZER_STATE_BYTES.get(optimizer, 8)
    chunk = min(ce_chunk, max(targets, 1))
    head = chunk * dims.vocab * (2 + 4) + 2 * targets * dims.hidden * activation_bytes
    return VramEstimate(
        weights=dims.params * weight_bytes,
        adapter=adapter_parameters * (4 + 4 + state + 2),
        activations=kept + working,
        head=head,
        tokens=tokens,
        checkpointed_layers=ckpt,
    )


def fit_checkpointing(dims: LmDims, budget_bytes: int, tokens: int, **kwargs: Any) -> VramEstimate:
    """The estimate with the fewest checkpointed layers that fits `budget_bytes`; InputError
    when even full checkpointing does not."""
    for ckpt in range(dims.layers + 1):
        estimate = estimate_vram(dims, tokens, checkpointed_layers=ckpt, **kwargs)
        if estimate.total <= budget_bytes:
            return estimate
    need = estimate_vram(dims, tokens, checkpointed_layers=dims.layers, **kwargs).total
    raise InputError(
        f"{tokens} tokens per step need {need / GIB:.1f} GiB even with every layer checkpointed, "
        f"over the {budget_bytes / GIB:.1f} GiB budget; lower --max-len or --pack-tokens, or use "
        "a GPU with more memory"
    )


def max_tokens(dims: LmDims, budget_bytes: int, cap: int = 16384, **kwargs: Any) -> int:
    """Most tokens per step that fit `budget_bytes` with full checkpointing (0 if none do)."""
    kwargs = {**kwargs, "checkpointed_layers": dims.layers}
    if estimate_vram(dims, cap, **kwargs).total <= budget_bytes:
        return cap
    low, high = 0, cap
    while low < high:
        mid = (low + high + 1) // 2
        if estimate_vram(dims, mid, **kwargs).total <= budget_bytes:
            low = mid
        else:
            high = mid - 1
    return low


# -- FLOPs ---------------------------------------------------------------------------------------
def train_flops(
    dims: LmDims,
    doc_lengths: Sequence[int],
    targets: int | None = None,
    lora_rank: int = 16,
    checkpointed_layers: int = 0,
) -> dict[str, float]:
    """Model FLOPs of one step (the baseline's formula) and hardware FLOPs (adds the forward
    recomputed in checkpointed layers). `targets` = tokens projected by the head (default N)."""
    n_tokens = sum(doc_lengths)
    targets = n_tokens if targets is None else targets
    lin = 2 * n_tokens * dims.linear_params_per_layer * dims.layers  # one forward
    head = 4 * targets * dims.vocab * dims.hidden
    pairs = sum(length * (length + 1) / 2 for length in doc_lengths)
    attn = dims.layers * 4 * dims.q_dim * pairs  # one forward
    io = sum(a + b for a, b in dims.projections().values())
    lora = dims.layers * 2 * n_tokens * lora_rank * io  # one forward
    model = 2 * lin + head + 3 * attn + 3 * lora
    recompute = (lin + attn + lora) * min(checkpointed_layers, dims.layers) / dims.layers
    return {"model_flops": model, "hardware_flops": model + recompute, "tokens": n_tokens}


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Fraction of `peak_flops` (per second) achieved."""
    return flops / seconds / peak_flops if seconds > 0 else math.nan
