"""Peak-GPU-memory model of DiT adapter training, and the auto-fit that sizes a run to a GPU.

Peak (bytes) = frozen weights + adapter state + activations + attention masks, × (1 + 5 %
fragmentation), where (N = crop/2 patch tokens per sample, B samples, K trained layers of which C
are checkpointed, L condition tokens):

- frozen weights: the DiT transformer only (the condition encoder, tokenizer and detokenizer stay
  off the GPU), 2 bytes per parameter in bf16;
- adapter: 16 bytes per trainable parameter (fp32 master 4 + grad 4 + two AdamW moments 8; Muon
  keeps one moment, so it is over-charged by 4);
- activations kept for backward, bf16, per token of a trained layer: `A = 13·H + 11·Dq + 5·Dkv
  + 7·I` elements plus the adapter's own intermediates (LoRA: r per module; LoKR: 2× the module
  output on its factored path, none on its merged one), times B·N·(K − C); merged LoKR adds one
  bf16 copy of the adapted weights per kept layer (`_merged_weights`); a checkpointed layer
  keeps only its input (1.5·H) and one layer's full set (with its merged weights) is live while
  it is recomputed; plus per trained layer the cross-attention K/V of the
  condition (4·Dkv·L per sample) and the output head (~1 KB per frame);
- masks: a padded micro-batch merges its key mask into a [B, 1, N, N] additive mask per
  self-attention call, saved for backward (2·B·N² bytes per trained layer).
Layers below the trained top K build no autograd graph and keep nothing.

Calibration (`tests/training/test_dit_vram.py` checks it): against the peer trainers' peaks
(shared/reference/dit-peer-baseline.md; LoRA r64 + MLP, batch 1, T 750-6000) the model predicts
+6 … +13 % without checkpointing and +21 … +26 % with every layer checkpointed — always over,
never under, like the seed's `dit-vram.h`. Part of the margin is real: our adapter keeps fp32
master weights (16 B/param) where the peers' bf16 AdamW kept about 8. The GPU bench
(`bench/dit_bench.py`) prints the estimate next to our own trainer's peak.

Auto-fit (`fit`): depth is never touched (`layers` is the user's quality choice). Starting from
the requested batch, no checkpointing and the largest crop (`crop_max_frames`, or the longest
song when shorter), it (1) shrinks the crop down to `crop_min_frames`, then (2) checkpoints more of
the trained layers (¼, ½, ¾, all), each time with the largest crop that fits, then (3) lowers the
batch one step at a time; below batch 1 + all layers checkpointed + the minimum crop it refuses
with the numbers. A crop, batch or checkpoint count the user fixed is kept as given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.training.adapters import AdapterSpec, lokr_shape
from hotstep_ray.training.speed import SpeedOptions

GB = 1e9
FRAGMENTATION = 0.05
ADAPTER_BYTES_PER_PARAM = 16
ACT_BYTES = 2  # bf16 activations
HEAD_BYTES_PER_FRAME = 1024  # prediction, target, noise, masks (fp32, 64 channels)
# torch.compile'd blocks save about half the activations (Inductor's partitioner recomputes the
# cheap elementwise chains in backward): on the GPU benches a peak minus weights and adapter is
# a little over half the model's activation term. 0.65 keeps the model above every such peak
# (2B and XL, LoRA and LoKR, short and long crops), as for eager.
COMPILED_ACTIVATION_SHARE = 0.65


class VramFitError(InputError):
    """No configuration within the user's limits fits the GPU; the message says what would."""


@dataclass(frozen=True)
class DitDims:
    """The DiT shapes that drive memory and FLOPs (official config.json keys)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    encoder_hidden: int
    patch: int = 2
    sliding_window: int = 128
    in_channels: int = 192
    out_channels: int = 64

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DitDims:
        hidden = int(config["hidden_size"])
        return cls(
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            kv_heads=int(config["num_key_value_heads"]),
            head_dim=int(config.get("head_dim", 128)),
            intermediate=int(config["intermediate_size"]),
            encoder_hidden=int(config.get("encoder_hidden_size") or hidden),
            patch=int(config.get("patch_size", 2)),
            sliding_window=int(config.get("sliding_window", 128)),
            in_channels=int(config.get("in_channels", 192)),
            out_channels=int(config.get("audio_acoustic_hidden_dim", 64)),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self, target_mlp: bool = True) -> list[tuple[str, int, int, str]]:
        """(name, in, out, side) of one layer's adaptable Linears; side = token | condition."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        rows = [
            ("self_attn.to_q", h, q, "token"),
            ("self_attn.to_k", h, kv, "token"),
            ("self_attn.to_v", h, kv, "token"),
            ("self_attn.to_out.0", q, h, "token"),
            ("cross_attn.to_q", h, q, "token"),
            # Cross K/V read the condition after condition_embedder (width H).
            ("cross_attn.to_k", h, kv, "condition"),
            ("cross_attn.to_v", h, kv, "condition"),
            ("cross_attn.to_out.0", q, h, "token"),
        ]
        if target_mlp:
            rows += [
                ("mlp.gate_proj", h, i, "token"),
                ("mlp.up_proj", h, i, "token"),
                ("mlp.down_proj", i, h, "token"),
            ]
        return rows

    def layer_params(self) -> int:
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attention = 2 * (h * q + 2 * h * kv + q * h + 2 * self.head_dim)  # + q/k norms
        return attention + 3 * h * i + 3 * h + 6 * h  # MLP, 3 RMSNorms, scale_shift_table

    def transformer_params(self) -> int:
        h = self.hidden
        stem = self.in_channels * h * self.patch + h  # proj_in conv
        stem += h * self.out_channels * self.patch + self.out_channels  # proj_out
        stem += 2 * (256 * h + h + h * h + h + h * 6 * h + 6 * h)  # time_embed, time_embed_r
        stem += self.encoder_hidden * h + h + h + 2 * h  # condition_embedder, norm_out, table
        return stem + self.layers * self.layer_params()


def targeted_linears(dims: DitDims, spec: AdapterSpec) -> list[tuple[str, int, int, str]]:
    """`dims.linears` rows (name, in, out, side) that `spec`'s targets adapt in one layer."""

    def leaf(name: str) -> str:  # "self_attn.to_q" -> "to_q"; "to_out.0" keeps its index
        return "to_out.0" if name.endswith("to_out.0") else name.rsplit(".", 1)[-1]

    targets = {leaf(target) for target in spec.targets}
    return [row for row in dims.linears(target_mlp=True) if leaf(row[0]) in targets]


def adapter_matrices(dims: DitDims, spec: AdapterSpec) -> list[tuple[int, int]]:
    """Shapes of one layer's trainable adapter matrices: LoRA A [r, in] and B [out, r]; LoKR
    w1 [out_l, in_m] and w2 [out_k, in_n] by LyCORIS's factor rules, each low-rank factor as
    its pair ([side, dim], [dim, side])."""
    shapes: list[tuple[int, int]] = []
    for _, fan_in, fan_out, _ in targeted_linears(dims, spec):
        if spec.kind == "lora":
            shapes += [(spec.rank, fan_in), (fan_out, spec.rank)]
            continue
        shape = lokr_shape(fan_in, fan_out, spec)
        for full, rows, cols in (
            (shape.w1_full, shape.out_l, shape.in_m),
            (shape.w2_full, shape.out_k, shape.in_n),
        ):
            shapes += [(rows, cols)] if full else [(rows, spec.rank), (spec.rank, cols)]
    return shapes


def adapter_params(dims: DitDims, spec: AdapterSpec, trained_layers: int) -> int:
    """Trainable parameters of `spec` on the top `trained_layers` layers."""
    return trained_layers * sum(rows * cols for rows, cols in adapter_matrices(dims, spec))


@dataclass(frozen=True)
class Plan:
    """One candidate configuration."""

    crop_frames: int
    batch: int
    ckpt_layers: int  # trained layers whose activations are recomputed in backward
    trained_layers: int
    condition_len: int


@dataclass(frozen=True)
class Estimate:
    weights: float  # bytes
    adapter: float
    activations: float
    masks: float
    total: float

    def gb(self) -> dict[str, float]:
        return {key: round(value / GB, 3) for key, value in asdict(self).items()}


def _adapter_act_elements(dims: DitDims, spec: AdapterSpec, merged: bool) -> int:
    """Extra elements per token per trained layer that the adapter keeps beyond the block's own
    count: LoRA its r-wide hidden per module; LoKR's factored path two module outputs, its merged
    Linear (`merged`: `SpeedOptions.kron_merges`) nothing per token, but see `_merged_weights`."""
    modules = [row for row in targeted_linears(dims, spec) if row[3] == "token"]
    if spec.kind == "lora":
        return spec.rank * len(modules)
    return 0 if merged else sum(2 * fan_out for _, _, fan_out, _ in modules)


def _merged_weights(dims: DitDims, spec: AdapterSpec) -> int:
    """Elements of one layer's token-side adapted weights (the condition-side K/V see fewer
    rows than `SpeedOptions.kron_merged_min_tokens` and stay factored). The merged LoKR forward
    builds a bf16 `W + ΔW` per adapted Linear, and the model charges one such copy per trained
    layer as if kept for the backward: a conservative charge, since what holds the merged path's
    memory was not profiled (its peaks: docs/BENCHMARKS.md, the `dit-2b-6000x*` rows)."""
    return sum(
        fan_in * fan_out
        for _, fan_in, fan_out, side in targeted_linears(dims, spec)
        if side == "token"
    )


def estimate(
    dims: DitDims,
    spec: AdapterSpec,
    plan: Plan,
    padded: bool = True,
    compiled: bool = False,
    speed: SpeedOptions = SpeedOptions(),
) -> Estimate:
    """Predicted peak bytes of one training step (see the module docstring); `compiled`: the
    blocks run torch.compile'd (`COMPILED_ACTIVATION_SHARE` of the layer activations); `speed`:
    whether LoKR takes its merged forward at these rows."""
    tokens = math.ceil(plan.crop_frames / dims.patch) * plan.batch
    h, q, kv, i = dims.hidden, dims.q_dim, dims.kv_dim, dims.intermediate
    merged = spec.kind == "lokr" and speed.kron_merges(tokens)
    full = 13 * h + 11 * q + 5 * kv + 7 * i + _adapter_act_elements(dims, spec, merged)
    kept = plan.trained_layers - plan.ckpt_layers
    per_token = kept * full + plan.ckpt_layers * 1.5 * h + (full if plan.ckpt_layers else 0)
    condition = plan.trained_layers * 4 * kv * plan.condition_len * plan.batch
    head = HEAD_BYTES_PER_FRAME * plan.crop_frames * plan.batch
    share = COMPILED_ACTIVATION_SHARE if compiled else 1.0
    activations = ACT_BYTES * (share * tokens * per_token + condition) + head
    if merged:  # like the per-token set: kept layers, plus the one being recomputed
        live = kept + (1 if plan.ckpt_layers else 0)
        activations += ACT_BYTES * _merged_weights(dims, spec) * live
    n = math.ceil(plan.crop_frames / dims.patch)
    masks = ACT_BYTES * plan.batch * n * n * plan.trained_layers if padded and plan.batch > 1 else 0
    weights = 2.0 * dims.transformer_params()
    adapter = ADAPTER_BYTES_PER_PARAM * adapter_params(dims, spec, plan.trained_layers)
    total = (weights + adapter + activations + masks) * (1 + FRAGMENTATION)
    return Estimate(weights, adapter, float(activations), float(masks), total)


@dataclass(frozen=True)
class VramFit:
    crop_frames: int
    batch: int
    ckpt_layers: int
    trained_layers: int
    estimate: Estimate
    budget: float | None  # bytes available to the run; None = unlimited (CPU)
    crop_source: str  # auto | fixed
    ckpt_source: str  # auto | fixed | off
    batch_source: str  # requested | reduced | clamped
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "crop_frames": self.crop_frames,
            "batch": self.batch,
            "ckpt_layers": self.ckpt_layers,
            "trained_layers": self.trained_layers,
            "est_gb": round(self.estimate.total / GB, 3),
            "parts_gb": self.estimate.gb(),
            "budget_gb": None if self.budget is None else round(self.budget / GB, 3),
            "crop_source": self.crop_source,
            "ckpt_source": self.ckpt_source,
            "batch_source": self.batch_source,
            "notes": list(self.notes),
        }


def trained_layers(options: TrainDitOptions, dims: DitDims) -> int:
    """`layers` 0 = every layer (full depth); K = the top K. Never reduced by the fit."""
    if options.layers > dims.layers:
        raise InputError(f"layers {options.layers} > the model's {dims.layers}")
    return options.layers or dims.layers


def ckpt_ladder(options: TrainDitOptions, trained: int) -> tuple[list[int], str]:
    """Checkpointed-layer counts to try, and their source. `checkpoint_segments`: 0 off,
    1 auto (0, ¼, ½, ¾, all of the trained layers), n >= 2 exactly n layers (capped at K)."""
    if options.checkpoint_segments == 0:
        return [0], "off"
    if options.checkpoint_segments >= 2:
        return [min(options.checkpoint_segments, trained)], "fixed"
    ladder = sorted({0, trained // 4, trained // 2, (3 * trained) // 4, trained})
    return ladder, "auto"


def _even(frames: int) -> int:
    return max(2, frames - frames % 2)


# Auto crops are whole multiples of 16 frames = 8 patch tokens. An odd token count (750 frames =
# 375 tokens; the default 1250 = 625) sends the adapters' weight-gradient GEMMs, whose reduction
# runs over the tokens, to unaligned cutlass kernels, a visible share of a 750-frame step's GPU
# time. A crop the user fixes is kept as given.
CROP_ALIGN_FRAMES = 16


def fold_factor(
    dims: DitDims,
    spec: AdapterSpec,
    fitted: VramFit,
    grad_accum: int,
    condition_len: int,
    budget_bytes: float | None,
    compiled: bool = False,
    speed: SpeedOptions = SpeedOptions(),
) -> int:
    """How many consecutive micro-batches of an optimizer window may run as one (batch x f),
    with the fitted crop and checkpointing unchanged: the largest f <= grad_accum whose step
    fits the budget, else 1. The loss is the same either way (every micro-batch's loss is a
    mean over its samples, weighted by its sample share of the window); one forward over f
    crops keeps the GPU busier than f forwards over one."""
    for f in range(max(1, grad_accum), 1, -1):
        p = Plan(
            fitted.crop_frames,
            fitted.batch * f,
            fitted.ckpt_layers,
            fitted.trained_layers,
            condition_len,
        )
        need = estimate(dims, spec, p, True, compiled, speed).total
        if budget_bytes is None or need <= budget_bytes:
            return f
    return 1


def fit(
    dims: DitDims,
    spec: AdapterSpec,
    options: TrainDitOptions,
    *,
    longest_song: int,
    songs: int,
    condition_len: int,
    budget_bytes: float | None,
    compiled: bool = False,
    speed: SpeedOptions = SpeedOptions(),
) -> VramFit:
    """Resolve crop, checkpointing and batch for a memory budget (None = unlimited);
    `compiled`: the blocks will run torch.compile'd (smaller activations); `speed`: the
    adapters' forwards (`estimate`)."""
    trained = trained_layers(options, dims)
    notes: list[str] = []
    batch = options.batch
    batch_source = "requested"
    if batch > songs:
        notes.append(f"batch {batch} clamped to the dataset's {songs} songs")
        batch, batch_source = songs, "clamped"
    if options.crop_frames:
        crop_hi = crop_lo = _even(options.crop_frames)
        crop_source = "fixed"
    else:
        crop_hi = _even(min(options.crop_max_frames, max(longest_song, 2)))
        crop_lo = min(_even(options.crop_min_frames), crop_hi)
        if crop_hi >= CROP_ALIGN_FRAMES:
            crop_hi -= crop_hi % CROP_ALIGN_FRAMES
            crop_lo = min(-(-crop_lo // CROP_ALIGN_FRAMES) * CROP_ALIGN_FRAMES, crop_hi)
        crop_source = "auto"
    ladder, ckpt_source = ckpt_ladder(options, trained)
    padded = batch > 1

    def plan(crop: int, b: int, ckpt: int) -> Plan:
        return Plan(crop, b, ckpt, trained, condition_len)

    def fits(p: Plan) -> bool:
        need = estimate(dims, spec, p, padded, compiled, speed).total
        return budget_bytes is None or need <= budget_bytes

    for b in range(batch, 0, -1):
        for ckpt in ladder:
            if not fits(plan(crop_lo, b, ckpt)):
                continue
            # binary search over the crops the source allows: aligned when auto, else even
            step = (
                CROP_ALIGN_FRAMES
                if crop_source == "auto" and crop_lo % CROP_ALIGN_FRAMES == 0
                else 2
            )
            lo, hi = crop_lo // step, crop_hi // step
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(plan(step * mid, b, ckpt)) else (lo, mid - 1)
            best = plan(step * lo, b, ckpt)
            if b < batch:
                notes.append(f"batch lowered {batch} -> {b} to fit")
                batch_source = "reduced"
            return VramFit(
                crop_frames=best.crop_frames,
                batch=b,
                ckpt_layers=ckpt,
                trained_layers=trained,
                estimate=estimate(dims, spec, best, padded, compiled, speed),
                budget=budget_bytes,
                crop_source=crop_source,
                ckpt_source=ckpt_source,
                batch_source=batch_source,
                notes=tuple(notes),
            )
    smallest = plan(crop_lo, 1, ladder[-1])
    need = estimate(dims, spec, smallest, False, compiled, speed).total
    raise VramFitError(
        f"DiT training does not fit: the smallest allowed configuration (crop {crop_lo} frames, "
        f"batch 1, {ladder[-1]}/{trained} layers checkpointed) needs {need / GB:.1f} GB but "
        f"{(budget_bytes or 0) / GB:.1f} GB is available. Train fewer layers (--layers K trains "
        "the top K), lower --crop-min-frames or the adapter size, or use a larger GPU."
    )


# -- compute ---------------------------------------------------------------------------------------
H200_BF16_PEAK_FLOPS = 989e12  # dense bf16 tensor-core peak of one H200 (spec sheet)


def _adapter_flops_per_token(fan_in: int, fan_out: int, spec: AdapterSpec) -> float:
    """Forward FLOPs of one adapted module per token: LoRA 2·r·(in+out); LoKR as `kron_linear`
    computes it (x·w2ᵀ then ·w1ᵀ, or through w2's low-rank factors)."""
    if spec.kind == "lora":
        return 2.0 * spec.rank * (fan_in + fan_out)
    shape = lokr_shape(fan_in, fan_out, spec)
    if shape.w2_full:
        first = 2.0 * shape.in_m * shape.in_n * shape.out_k
    else:
        first = 2.0 * shape.in_m * spec.rank * (shape.in_n + shape.out_k)
    return first + 2.0 * shape.out_k * shape.in_m * shape.out_l


def step_flops(
    dims: DitDims,
    spec: AdapterSpec,
    frames: int,
    condition_len: int = 769,
    batch: int = 1,
    trained_layers: int | None = None,
    ckpt_layers: int = 0,
) -> dict[str, float]:
    """Model FLOPs of one training step by the peer baseline's formula (dit-peer-baseline.md:
    2B T=6000 L=769 LoRA r64 + MLP = 22.67 TFLOP, XL 61.06), so MFU numbers compare.

    model = fwd_lin + bwd_lin + 3·attn_fwd + 3·adapter_fwd, where bwd_lin repeats fwd_lin except
    cross-attention K/V and condition_embedder (inputs without gradient) and attention counts
    4·Dq per (query, key) pair (sliding layers only pairs with |i−j| <= window). `hardware`
    adds the recomputed forward of checkpointed layers (HFU)."""
    trained = dims.layers if trained_layers is None else trained_layers
    n, cond = math.ceil(frames / dims.patch), condition_len
    h, q, kv, i = dims.hidden, dims.q_dim, dims.kv_dim, dims.intermediate
    token_layer = 2 * n * (h * q + 2 * h * kv + q * h) + 2 * n * (h * q + q * h) + 2 * n * 3 * h * i
    cond_layer = 2 * cond * 2 * h * kv
    stem = 2 * n * dims.in_channels * dims.patch * h + 2 * n * h * dims.out_channels * dims.patch
    embed = 2 * cond * dims.encoder_hidden * h
    fwd_lin = dims.layers * (token_layer + cond_layer) + stem + embed
    bwd_lin = dims.layers * token_layer + stem
    w = dims.sliding_window
    sliding_pairs = n * n - ((n - w - 1) * (n - w) if n > w + 1 else 0)
    sliding = (dims.layers + 1) // 2  # layers 0, 2, 4, ... (the official layer_types rule)
    pairs = sliding * sliding_pairs + (dims.layers - sliding) * n * n + dims.layers * n * cond
    attn_fwd = 4.0 * q * pairs
    adapter_layer = 0.0
    for _, fan_in, fan_out, side in targeted_linears(dims, spec):
        tokens = n if side == "token" else cond
        adapter_layer += tokens * _adapter_flops_per_token(fan_in, fan_out, spec)
    adapter_fwd = trained * adapter_layer
    model = batch * (fwd_lin + bwd_lin + 3 * attn_fwd + 3 * adapter_fwd)
    share = ckpt_layers / dims.layers
    recompute = batch * share * (fwd_lin + attn_fwd + adapter_fwd)
    return {"model": model, "hardware": model + recompute}


def min_required_bytes(
    dims: DitDims,
    spec: AdapterSpec,
    options: TrainDitOptions,
    *,
    longest_song: int,
    condition_len: int,
) -> float:
    """The least memory this job can run in given the user's fixed choices (what a scheduler
    must find on a GPU): the fit's last resort — minimum crop, batch 1 unless fixed, the most
    checkpointing allowed."""
    trained = trained_layers(options, dims)
    ladder, _ = ckpt_ladder(options, trained)
    crop = (
        _even(options.crop_frames)
        if options.crop_frames
        else min(
            _even(options.crop_min_frames),
            _even(min(options.crop_max_frames, max(longest_song, 2))),
        )
    )
    plan = Plan(crop, 1, ladder[-1], trained, condition_len)
    return estimate(dims, spec, plan, padded=False).total
