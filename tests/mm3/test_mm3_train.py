"""Training pieces: seam-safe crops (trap 17), the target sign (trap 1), the dW gate (trap 16)
and the export-time group filter with ComfyUI keys (trap 18)."""

from __future__ import annotations

import warnings

import pytest
import torch
from diffusers import MiniMaxMusic3Transformer1DModel
from mm3_helpers import write_cache
from torch import nn

from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import flow, sampler
from hotstep_ray.mm3.data import CropStats, Song, crop_is_valid, draw_crop, has_valid_crop
from hotstep_ray.mm3.export import (
    COMFY_PREFIX,
    MM3_TARGETS,
    base_norms,
    comfy_state,
    delta_gate,
    delta_norm,
    export_comfy,
    load_comfy,
)
from hotstep_ray.mm3.tiny import TINY_DIT
from hotstep_ray.mm3.train import Mm3TrainOptions, setup, train
from hotstep_ray.training import adapters
from hotstep_ray.training.export import delta_report

INNER = TINY_DIT["num_attention_heads"] * TINY_DIT["attention_head_dim"]  # 32


def tiny_dit(seed: int = 1) -> MiniMaxMusic3Transformer1DModel:
    torch.manual_seed(seed)
    return MiniMaxMusic3Transformer1DModel(**TINY_DIT)


def with_lora(rank: int = 4, seed: int = 2) -> MiniMaxMusic3Transformer1DModel:
    model = tiny_dit()
    adapters.inject(
        model, adapters.AdapterSpec(kind="lora", rank=rank, alpha=2 * rank, targets=MM3_TARGETS)
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in adapters.trainable_parameters(model):
            param.copy_(0.05 * torch.randn(param.shape, generator=gen))
    return model


# -- crops ----------------------------------------------------------------------------------------
def test_crops_never_straddle_a_seam():
    spans = ((0, 100), (100, 250), (250, 300))  # seams at 100 and 250
    song = Song("s", torch.zeros(128, 300), torch.zeros(300, 8), spans)
    stats = CropStats()
    starts = [draw_crop(song, 60, flow.generator(1, step), "random", stats) for step in range(2000)]
    assert all(crop_is_valid(spans, s, 60) for s in starts)
    assert not any(s < seam < s + 60 for s in starts for seam in (100, 250))
    assert stats.rejected > 0  # straddling draws happened and were redrawn
    assert min(starts) == 0 and max(starts) == 190  # the last segment is shorter than a crop
    assert draw_crop(song, 60, flow.generator(1, 0), "beginning") == 0
    assert not has_valid_crop(song, 160)  # longer than any segment: the song is skipped
    # A song whose only valid crop is one position still trains (fallback after redraws).
    tight = Song("t", torch.zeros(128, 300), torch.zeros(300, 8), ((0, 150), (150, 210)))
    assert {draw_crop(tight, 150, flow.generator(2, s)) for s in range(20)} == {0}


# -- trap 1 ---------------------------------------------------------------------------------------
class OracleVelocity(nn.Module):
    """The exact minimiser of our objective for one data point x0: v = (x0 - x_t) / (1 - t)."""

    def __init__(self, x0: torch.Tensor) -> None:
        super().__init__()
        self.x0 = nn.Parameter(x0, requires_grad=False)

    def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict=False):
        t = timestep.view(-1, 1, 1)
        return ((self.x0 - hidden_states) / (1 - t),)


def test_a_model_with_zero_training_loss_samples_the_data():
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, 128, 16, generator=gen) * 2
    oracle, cond = OracleVelocity(x0), torch.zeros(1, 16, 8)
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.tensor([0.1])
    # Elementwise float32 only: the oracle's velocity is off the target by a few ulps of
    # |x| <~ 12 (~3e-6), so the MSE is <~ 1e-11; the negated target costs 4 E|x0 - noise|² = 20.
    assert flow.flow_loss(oracle, x0, noise, t, cond).item() < 1e-10
    check = flow.sign_check(oracle, x0, cond)
    assert check["loss_target"] < 1e-10 < check["loss_negated"]
    # Our sampler (the reference schedule) integrates that velocity onto the data. The last Euler
    # step (to t = 1 exactly) lands on x + (1 - t) (x0 - x) / (1 - t): x0 up to ~3 roundings of
    # values <~ 12, ~3e-6 (elementwise, no reductions); a schedule stopping short of t = 1 by δ
    # misses by δ |x0 - noise|.
    out = sampler.sample_window(oracle, cond, noise, guidance=1.0)
    assert torch.allclose(out, x0, rtol=0, atol=1e-5)


def test_training_loss_on_the_right_target_is_far_below_the_negated(tmp_path):
    storage = Storage(tmp_path)
    latents = 2 * torch.sin(torch.arange(48)[None, :] / 4 + torch.arange(128)[:, None])
    condition = torch.randn(
        48, TINY_DIT["condition_dim"], generator=torch.Generator().manual_seed(3)
    )
    write_cache(storage, "one", "v", [("song", latents, condition, [(0, 48)])])
    options = Mm3TrainOptions(
        variant_key="v", rank=8, alpha=8, learning_rate=1e-2, steps=150, crop_latents=24,
        batch=2, dtype="float32", device="cpu", delta_every=0,
    )  # fmt: skip
    run = setup(storage, "one", "", options, transformer=tiny_dit())
    x0, cond = latents[None, :, :24], condition[None, :24]
    before = flow.sign_check(run.transformer, x0, cond)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lr 1e-2 on a tiny model trips the 5 % gate
        train(run)
    after = flow.sign_check(run.transformer, x0, cond)
    assert 0.8 < before["ratio"] < 1.2  # the random model has no opinion
    # a training outcome (150 steps), not round-off: a sign-flipped target ends above 1
    assert after["loss_target"] < 0.5 * after["loss_negated"]
    assert run.losses[-1] < run.losses[0]


# -- trap 16 --------------------------------------------------------------------------------------
def test_delta_gate_matches_the_shared_report_and_warns_above_5_percent():
    model = with_lora()
    norms = base_norms(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gate = delta_gate(model, norms)
    shared = {g["group"]: g["median"] for g in delta_report(model, group_of=lambda p: p)}
    ours = {path: delta_norm(layer) / norms[path] for path, layer in adapters.tuner_layers(model)}
    # the r x r norm (float64) equals the materialised one: float32 ΔW = B A (4 terms) and its norm
    # over <= 32 x 288 entries, u sqrt(9216) / 2 ~ 3e-6 relative (u = eps_f32 / 2)
    assert ours == pytest.approx(shared, rel=1e-5)
    for _, layer in adapters.tuner_layers(model):  # shrink every B: a healthy delta
        layer.lora_B[adapters.ADAPTER_NAME].weight.data.mul_(1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning below the gate
        healthy = delta_gate(model, norms)
    assert not healthy.flagged and healthy.median < 0.05  # the 5 % gate; B x 1e-3 is far under it
    for _, layer in adapters.tuner_layers(model):
        layer.lora_B[adapters.ADAPTER_NAME].weight.data.mul_(1e5)
    with pytest.warns(UserWarning, match="5% gate"):
        damaged = delta_gate(model, norms)
    assert damaged.flagged and damaged.median > 0.05  # B x 1e2 of the original: far over it
    assert [g["group"] for g in gate.groups] == [
        "q", "k", "v", "o", "ff_in", "ff_out", "proj_in", "proj_out",
    ]  # fmt: skip


# -- trap 18 --------------------------------------------------------------------------------------
def test_export_filter_zeroes_qk_rows_and_drops_the_projections(tmp_path):
    model = with_lora(rank=4)
    full, filtered = comfy_state(model, filtered=False), comfy_state(model, filtered=True)
    qkv = "layers.0.self_attn.to_qkv"
    assert full[f"{qkv}.lora_A.weight"].shape == (12, INNER)  # [3r, in]
    assert full[f"{qkv}.lora_B.weight"].shape == (3 * INNER, 12)  # block-diagonal [3 out, 3r]
    assert float(full[f"{qkv}.alpha"]) == 12.0  # scale folded into B: alpha = rank
    # The fused delta is [dW_q; dW_k; dW_v] of the live adapter.
    live = adapters.delta_weights(model)
    fused = full[f"{qkv}.lora_B.weight"] @ full[f"{qkv}.lora_A.weight"]
    expected = torch.cat([live[f"transformer_blocks.0.attn.{n}"] for n in ("to_q", "to_k", "to_v")])
    # float32 rank-4 products of |ΔW| <~ 0.06 (zero blocks add exactly): ~(r + 2) u max|ΔW| ~ 2e-8;
    # a misplaced block misses by O(|ΔW|)
    assert torch.allclose(fused, expected, atol=1e-6)
    b = filtered[f"{qkv}.lora_B.weight"]
    assert torch.count_nonzero(b[: 2 * INNER]) == 0  # q and k rows zeroed
    assert torch.equal(b[2 * INNER :], full[f"{qkv}.lora_B.weight"][2 * INNER :])  # v kept
    for name in ("project_in", "project_out"):
        assert f"{name}.lora_A.weight" in full and not any(k.startswith(name) for k in filtered)
    for name in ("self_attn.to_out", "ff.ff.0.proj", "ff.ff.2"):
        key = f"layers.1.{name}.lora_B.weight"
        assert torch.equal(filtered[key], full[key])

    storage = Storage(tmp_path)
    key = export_comfy(model, storage, "mm3_lora.safetensors", trigger="zx9")
    from safetensors.torch import load as load_bytes

    from hotstep_ray.core.safetensors_header import metadata_of

    data = storage.read_bytes(key)
    tensors, meta = load_bytes(data), metadata_of(data)
    assert all(k.startswith(COMFY_PREFIX) for k in tensors)
    assert f"{COMFY_PREFIX}layers.0.self_attn.to_qkv.lora_B.weight" in tensors
    assert meta["hot_step_trigger"] == "zx9" and meta["rank"] == "4"
    # Round trip: the reloaded adapter has exactly the filtered delta.
    reloaded = with_lora(rank=4, seed=9)
    load_comfy(reloaded, tensors)
    again = adapters.delta_weights(reloaded)
    for path, delta in live.items():
        dropped = path.endswith(("to_q", "to_k")) or path in ("proj_in", "proj_out")
        # float32 file, the same products: round-off only, as for the fused delta above
        assert torch.allclose(again[path], torch.zeros_like(delta) if dropped else delta, atol=1e-6)


def test_songs_without_a_seam_free_crop_are_skipped(tmp_path):
    storage = Storage(tmp_path)
    short = [("short", torch.zeros(128, 40), torch.zeros(40, 32), [(0, 20), (20, 40)])]
    long = [("long", torch.zeros(128, 64), torch.zeros(64, 32), [(0, 64)])]
    write_cache(storage, "two", "v", short + long)
    options = Mm3TrainOptions(variant_key="v", crop_latents=32, dtype="float32", device="cpu")
    run = setup(storage, "two", "", options, transformer=tiny_dit())
    assert [s.stem for s in run.songs] == ["long"]
