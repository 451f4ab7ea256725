"""The VRAM model (calibrated against measured peer peaks) and the auto-fit order."""

from __future__ import annotations

import pytest

from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.models.full_configs import dit_config, dit_param_counts
from hotstep_ray.training import adapters
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.dit_vram import (
    GB,
    DitDims,
    Plan,
    VramFitError,
    adapter_params,
    estimate,
    fit,
    fold_factor,
    min_required_bytes,
    step_flops,
)
from hotstep_ray.training.speed import SpeedOptions

GIB = 2**30
DIMS = {layout: DitDims.from_config(dit_config(layout)) for layout in ("2b", "xl")}
LORA64 = AdapterSpec(kind="lora", rank=64, alpha=128)
LORA128 = AdapterSpec(kind="lora", rank=128, alpha=256)


def test_shapes_and_parameter_counts_match_the_real_models() -> None:
    for layout, dims in DIMS.items():
        assert dims.transformer_params() == dit_param_counts(dit_config(layout))["transformer"]
    # PEFT's own counts for the peers' r64 q/k/v/o(+MLP) adapters (dit-peer-baseline.md)
    assert adapter_params(DIMS["2b"], LORA64, 24) == 81_788_928
    assert adapter_params(DIMS["xl"], LORA64, 32) == 159_383_552
    attention_only = AdapterSpec(kind="lora", rank=64, targets=("to_q", "to_k", "to_v", "to_out.0"))
    assert adapter_params(DIMS["2b"], attention_only, 24) == 44_040_192


# Measured peak GiB on an H200, LoRA r64 + MLP, batch 1, L = 769 (dit-peer-baseline.md).
PEER_PEAKS = [
    ("2b", 750, False, 5.5),
    ("2b", 1500, False, 7.2),
    ("2b", 3000, False, 10.5),
    ("2b", 6000, False, 17.2),
    ("xl", 1500, False, 16.2),
    ("xl", 6000, False, 36.2),
    ("2b", 750, True, 3.7),
    ("2b", 6000, True, 4.4),
    ("xl", 6000, True, 10.3),
]


@pytest.mark.parametrize(("layout", "frames", "ckpt", "measured"), PEER_PEAKS)
def test_estimate_over_predicts_measured_peaks_a_little(layout, frames, ckpt, measured) -> None:
    dims = DIMS[layout]
    plan = Plan(frames, 1, dims.layers if ckpt else 0, dims.layers, 769)
    predicted = estimate(dims, LORA64, plan, padded=False).total / GIB
    # the model's calibration band over the measured peaks (Python arithmetic: no CPU dependence)
    assert measured <= predicted <= 1.3 * measured


# Our own trainer with torch.compile'd blocks, measured on an H200 (docs/BENCHMARKS.md): layout,
# adapter, frames, batch, peak GiB. Plain compiled blocks (third DiT measurement): the allocated
# peak. With CUDA graphs (`compile: auto` when nothing is checkpointed; fourth and fifth device
# runs): the RESERVED peak, since the graph pool is not in the allocated one.
LOKR512 = AdapterSpec(kind="lokr", rank=512, alpha=512, factor=6, decompose_both=True)
# The LoKR rows name the forward they ran with (`SpeedOptions.kron_forward`; LoRA: "-").
COMPILED_PEAKS = [
    ("2b", LORA64, "-", 6000, 1, 11.1),
    ("2b", LORA64, "-", 6000, 2, 18.16),
    ("xl", LORA64, "-", 6000, 1, 24.62),
    ("2b", LORA64, "-", 750, 8, 12.43),
    ("2b", LOKR512, "factored", 6000, 1, 15.59),
    ("2b", LORA64, "-", 6000, 2, 20.05),  # CUDA graphs, reserved
    ("2b", LORA64, "-", 750, 8, 13.57),  # CUDA graphs, reserved
    ("2b", LOKR512, "factored", 6000, 1, 15.1),  # CUDA graphs, reserved
    ("2b", LOKR512, "merged", 6000, 1, 14.0),  # CUDA graphs, reserved (ninth device run)
    ("2b", LOKR512, "merged", 6000, 2, 20.88),  # CUDA graphs, reserved (ninth device run)
    ("xl", LORA64, "-", 6000, 2, 42.3),  # CUDA graphs, reserved (seventh device run)
    # CUDA graphs, reserved, each block one graph on torch 2.11 (tenth device run)
    ("2b", LORA64, "-", 6000, 1, 12.33),
    ("2b", LORA64, "-", 6000, 2, 19.89),
    ("2b", LOKR512, "merged", 6000, 1, 14.14),
    ("2b", LOKR512, "merged", 6000, 2, 20.53),
]


@pytest.mark.parametrize(
    ("layout", "spec", "forward", "frames", "batch", "measured"), COMPILED_PEAKS
)
def test_compiled_estimate_stays_above_measured_peaks(
    layout, spec, forward, frames, batch, measured
):
    speed = SpeedOptions() if forward == "-" else SpeedOptions(kron_forward=forward)
    dims = DIMS[layout]
    plan = Plan(frames, batch, 0, dims.layers, 769)
    compiled = estimate(dims, spec, plan, padded=False, compiled=True, speed=speed).total / GIB
    eager = estimate(dims, spec, plan, padded=False, speed=speed).total / GIB
    assert measured <= compiled <= 1.3 * measured  # calibration band, as above
    assert compiled < 0.85 * eager  # the eager model would waste a third of the GPU


@pytest.mark.parametrize(
    "spec",
    [
        AdapterSpec(kind="lora", rank=4, alpha=8),
        AdapterSpec(kind="lokr", rank=4, alpha=4, factor=4, decompose_both=True),  # low-rank w2
        AdapterSpec(kind="lokr", rank=2, alpha=4, factor=2, decompose_both=True),
    ],
)
def test_adapter_matrices_are_the_injected_adapters(spec) -> None:
    """The shapes the model (and the Muon bench) reason about are the parameters peft creates
    in one layer of a real (tiny XL) DiT."""
    from hotstep_ray.models.full_configs import build_dit
    from hotstep_ray.models.tiny_dit import tiny_config
    from hotstep_ray.training.dit_vram import adapter_matrices

    config = tiny_config("xl-turbo")
    transformer = build_dit(config, silence_frames=64).transformer
    adapters.inject(transformer, spec)
    layer0 = [
        tuple(param.shape)
        for name, param in adapters.trainable_parameters(transformer)
        if ".layers.0." in f".{name}"
    ]
    assert sorted(layer0) == sorted(adapter_matrices(DitDims.from_config(config), spec))


def test_checkpointed_merged_lokr_is_charged_one_layers_merged_weights() -> None:
    """The merged forward keeps no per-token LoKR activations; its W + ΔW copies count only for
    the layers that keep their activations (plus the one being recomputed), so with every layer
    checkpointed it must not be estimated above the factored path."""
    dims = DIMS["2b"]
    plan = Plan(6000, 1, dims.layers, dims.layers, 769)
    merged = estimate(dims, LOKR512, plan, padded=False, compiled=True).total
    factored = estimate(
        dims,
        LOKR512,
        plan,
        padded=False,
        compiled=True,
        speed=SpeedOptions(kron_forward="factored"),
    ).total
    assert merged <= factored


def _options(**overrides) -> TrainDitOptions:
    return TrainDitOptions(adapter_type="lora", rank=128, alpha=256, **overrides)


def _fit(budget_gb: float, **overrides):
    return fit(
        DIMS["2b"],
        LORA128,
        _options(**overrides),
        longest_song=6000,
        songs=10,
        condition_len=800,
        budget_bytes=budget_gb * GB,
    )


def test_auto_fit_shrinks_crop_first_then_checkpoints_then_batch() -> None:
    roomy = _fit(200, batch=4)
    # crop_max 1250, aligned down to whole 16-frame (8-token) steps
    assert (roomy.crop_frames, roomy.batch, roomy.ckpt_layers) == (1248, 4, 0)
    # a little less: the crop gives first, nothing else moves
    crop_only = _fit(roomy.estimate.total / GB * 0.9, batch=4)
    assert 375 <= crop_only.crop_frames < 1248 and crop_only.crop_frames % 16 == 0
    assert (crop_only.batch, crop_only.ckpt_layers) == (4, 0)
    # below the minimum crop without checkpointing: checkpointing starts, crop back up
    at_min = estimate(DIMS["2b"], LORA128, Plan(376, 4, 0, 24, 800)).total / GB
    with_ckpt = _fit(at_min * 0.95, batch=4)
    assert with_ckpt.batch == 4 and with_ckpt.ckpt_layers > 0
    assert with_ckpt.crop_frames >= 375
    # below batch 4 with every layer checkpointed at the minimum crop: the batch gives
    floor4 = estimate(DIMS["2b"], LORA128, Plan(376, 4, 24, 24, 800)).total / GB
    fewer = _fit(floor4 * 0.97, batch=4)
    assert fewer.batch < 4 and fewer.batch_source == "reduced"
    # depth is never touched
    assert all(f.trained_layers == 24 for f in (roomy, crop_only, with_ckpt, fewer))


def test_refusal_names_the_need_and_the_way_out() -> None:
    with pytest.raises(VramFitError) as info:
        _fit(4.0)
    message = str(info.value)
    assert "needs" in message and "4.0 GB" in message and "--layers" in message
    # the same budget fits when only the top 2 layers train
    assert _fit(4.0, layers=2).trained_layers == 2


def test_user_choices_are_kept() -> None:
    fixed = _fit(200, crop_frames=3001, batch=2, checkpoint_segments=6)
    assert (fixed.crop_frames, fixed.batch, fixed.ckpt_layers) == (3000, 2, 6)
    assert (fixed.crop_source, fixed.ckpt_source) == ("fixed", "fixed")
    assert _fit(200, crop_frames=750).crop_frames == 750  # a fixed crop is not aligned
    off = _fit(200, checkpoint_segments=0)
    assert off.ckpt_source == "off" and off.ckpt_layers == 0
    clamped = fit(
        DIMS["2b"],
        LORA128,
        _options(batch=8),
        longest_song=900,
        songs=3,
        condition_len=800,
        budget_bytes=None,
    )
    assert clamped.batch == 3 and clamped.batch_source == "clamped"
    assert clamped.crop_frames == 896  # the longest song (900) is shorter than crop_max; aligned


def test_minimum_requirement_is_what_a_scheduler_must_find() -> None:
    xl = min_required_bytes(DIMS["xl"], LORA128, _options(), longest_song=6000, condition_len=800)
    assert 10 * GB < xl < 20 * GB  # a 24 GB card is enough, a 16 GB one is not
    need = min_required_bytes(DIMS["2b"], LORA128, _options(), longest_song=6000, condition_len=800)
    assert _fit(need / GB * 1.01).crop_frames >= 375
    with pytest.raises(VramFitError):
        _fit(need / GB * 0.99)


@pytest.mark.parametrize(
    ("layout", "targets", "tflop"),
    [
        ("2b", None, 22.67),
        ("2b", ("to_q", "to_k", "to_v", "to_out.0"), 21.99),
        ("xl", None, 61.06),
        ("xl", ("to_q", "to_k", "to_v", "to_out.0"), 59.70),
    ],
)
def test_step_flops_reproduce_the_peer_formula(layout, targets, tflop) -> None:
    spec = LORA64 if targets is None else AdapterSpec(kind="lora", rank=64, targets=targets)
    flops = step_flops(DIMS[layout], spec, frames=6000, condition_len=769)
    # the peer figures are rounded to 0.01 TFLOP (half-unit 0.005); float64 formula otherwise exact
    assert flops["model"] / 1e12 == pytest.approx(tflop, abs=0.01)
    with_ckpt = step_flops(DIMS[layout], spec, 6000, 769, ckpt_layers=DIMS[layout].layers)
    assert with_ckpt["hardware"] > 1.3 * with_ckpt["model"]  # + one recomputed forward (~1/3)


def test_compiled_runs_fit_more_into_the_same_gpu() -> None:
    options = _options(batch=2, checkpoint_segments=1, crop_frames=6000)
    args = {"longest_song": 6000, "songs": 10, "condition_len": 800, "budget_bytes": 30 * GB}
    eager = fit(DIMS["2b"], LORA128, options, **args)
    compiled = fit(DIMS["2b"], LORA128, options, compiled=True, **args)
    # full songs at batch 2: eager has to checkpoint layers, compiled needs fewer (or none)
    assert compiled.crop_frames == eager.crop_frames == 6000 and compiled.batch == eager.batch == 2
    assert compiled.ckpt_layers < eager.ckpt_layers
    assert compiled.estimate.total <= 30 * GB


def test_an_optimizer_windows_micro_batches_fold_as_far_as_memory_allows() -> None:
    """`fold_factor` keeps the fitted crop and checkpointing and runs up to grad_accum planned
    micro-batches per forward: all of them with room, as many as fit otherwise, one at least."""
    fitted = _fit(200, batch=1)  # crop 1248, batch 1, nothing checkpointed
    assert (fitted.batch, fitted.ckpt_layers) == (1, 0)

    def need(batch: int) -> float:
        plan = Plan(fitted.crop_frames, batch, 0, fitted.trained_layers, 800)
        return estimate(DIMS["2b"], LORA128, plan, True).total

    assert fold_factor(DIMS["2b"], LORA128, fitted, 4, 800, None) == 4
    assert fold_factor(DIMS["2b"], LORA128, fitted, 4, 800, 200 * GB) == 4
    assert fold_factor(DIMS["2b"], LORA128, fitted, 4, 800, (need(2) + need(3)) / 2) == 2
    assert fold_factor(DIMS["2b"], LORA128, fitted, 4, 800, need(2) * 0.99) == 1
    assert fold_factor(DIMS["2b"], LORA128, fitted, 1, 800, None) == 1  # nothing to fold
