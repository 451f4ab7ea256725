"""Loading ACE-Step DiT folders: clear errors for bad folders, both layouts, tiny checkpoints,
and the padded-key attention for micro-batches."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hotstep_ray.models import acestep_ops as ops
from hotstep_ray.models.acestep_dit import load_acestep_dit, save_diffusers, save_official
from hotstep_ray.models.acestep_keys import (
    diffusers_to_official_key,
    official_to_diffusers_key,
)
from hotstep_ray.models.errors import CheckpointError
from hotstep_ray.models.tiny_dit import TINY_VARIANTS, write_tiny_dit

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
TINY = FIXTURES / "acestep15-tiny" / "checkpoint"
TINY_XL = FIXTURES / "acestep15-tiny-xl" / "checkpoint"


def _copy(source: Path, target: Path) -> Path:
    # copyfile, not copy2: fixture files may be read-only and the tests rewrite them.
    return Path(shutil.copytree(source, target, copy_function=shutil.copyfile))


def _rewrite(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _velocity(models, data: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return models.transformer(
            hidden_states=data["in.hidden_states"],
            timestep=data["in.timestep"],
            timestep_r=data["in.timestep_r"],
            encoder_hidden_states=data["in.encoder_hidden_states"],
            context_latents=data["in.context_latents"],
            return_dict=False,
        )[0]


# --------------------------------------------------------------------------- errors


def test_missing_folder_and_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_acestep_dit(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="config.json"):
        load_acestep_dit(tmp_path)
    folder = _copy(TINY, tmp_path / "ckpt")
    (folder / "silence_latent.pt").unlink()
    with pytest.raises(CheckpointError, match=r"silence_latent\.pt"):
        load_acestep_dit(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing model\.safetensors"):
        load_acestep_dit(folder)


def test_truncated_safetensors(tmp_path: Path) -> None:
    folder = _copy(TINY, tmp_path / "ckpt")
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated.*1000 missing"):
        load_acestep_dit(folder)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="too short"):
        load_acestep_dit(folder)


def test_wrong_shape_missing_and_unexpected_keys(tmp_path: Path) -> None:
    folder = _copy(TINY, tmp_path / "ckpt")
    key = "decoder.layers.0.self_attn.q_proj.weight"
    _rewrite(folder, lambda t: t.__setitem__(key, t[key][:32].clone()))
    with pytest.raises(CheckpointError, match=re.escape(f"{key} expected [64, 64] found [32, 64]")):
        load_acestep_dit(folder)

    folder = _copy(TINY, tmp_path / "ckpt2")
    _rewrite(folder, lambda t: t.pop("encoder.timbre_encoder.special_token"))
    with pytest.raises(CheckpointError, match="1 missing condition_encoder keys: timbre_encoder"):
        load_acestep_dit(folder)

    folder = _copy(TINY, tmp_path / "ckpt3")
    _rewrite(folder, lambda t: t.__setitem__("decoder.extra_head.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected keys: decoder\.extra_head\.weight"):
        load_acestep_dit(folder)

    folder = _copy(TINY, tmp_path / "ckpt4")
    _rewrite(folder, lambda t: t.__setitem__("lm_head.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected keys outside .*lm_head\.weight"):
        load_acestep_dit(folder)


def test_quantized_weights_are_refused(tmp_path: Path) -> None:
    folder = _copy(TINY, tmp_path / "ckpt")
    key = "decoder.layers.1.mlp.up_proj.weight"
    _rewrite(folder, lambda t: t.__setitem__(key, t[key].to(torch.int8)))
    with pytest.raises(CheckpointError, match=f"{re.escape(key)} is I8: quantized"):
        load_acestep_dit(folder)
    folder = _copy(TINY, tmp_path / "fp8")
    _rewrite(folder, lambda t: t.__setitem__(key, t[key].to(torch.float8_e4m3fn)))
    with pytest.raises(CheckpointError, match="F8_E4M3: quantized"):
        load_acestep_dit(folder)


def test_wrong_variant_and_wrong_model_type(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="expected variant 'base', found 'turbo'"):
        load_acestep_dit(TINY, expect_variant="base")
    assert load_acestep_dit(TINY_XL, expect_variant="xl-turbo").variant.layout == "xl"
    folder = _copy(TINY, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    with pytest.raises(CheckpointError, match="model_type is 'qwen3'"):
        load_acestep_dit(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable JSON"):
        load_acestep_dit(folder)


class _NotATensor:
    pass


def test_silence_latent_is_never_unpickled_beyond_tensors(tmp_path: Path) -> None:
    folder = _copy(TINY, tmp_path / "ckpt")
    torch.save(_NotATensor(), folder / "silence_latent.pt")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_acestep_dit(folder)
    torch.save({"latent": torch.zeros(1, 64, 10)}, folder / "silence_latent.pt")
    with pytest.raises(CheckpointError, match=r"expected a \[1, 64, N\] tensor"):
        load_acestep_dit(folder)


def test_every_torch_load_in_the_package_is_weights_only() -> None:
    offenders = []
    for path in sorted((REPO / "hotstep_ray").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "torch.load(" in line and "weights_only=True" not in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, offenders


# --------------------------------------------------------------------------- layouts


def test_key_mapping_round_trips_every_official_key() -> None:
    keys = load_file(str(TINY / "model.safetensors")).keys()
    for key in keys:
        component, ours = official_to_diffusers_key(key)
        assert diffusers_to_official_key(component, ours) == key
    assert official_to_diffusers_key("decoder.proj_in.1.weight") == (
        "transformer",
        "proj_in_conv.weight",
    )
    assert official_to_diffusers_key("detokenizer.layers.0.self_attn.o_proj.weight") == (
        "detokenizer",
        "layers.0.self_attn.to_out.0.weight",
    )


def test_diffusers_round_trip_and_official_rewrite(tmp_path: Path) -> None:
    data = load_file(str(FIXTURES / "acestep15-tiny-xl" / "reference" / "dit_b2_t40.safetensors"))
    official = load_acestep_dit(TINY_XL, "cpu")
    save_diffusers(official, tmp_path / "diffusers")
    assert (tmp_path / "diffusers" / "audio_token_detokenizer" / "config.json").is_file()
    reloaded = load_acestep_dit(tmp_path / "diffusers", "cpu")
    assert reloaded.variant.source_format == "diffusers"
    assert reloaded.variant.name == "xl-turbo"
    assert reloaded.config["encoder_hidden_size"] == 64
    assert torch.equal(reloaded.silence_latent, official.silence_latent)
    # Bit-exact against the model it was saved from (same weights, same kernels, this process);
    # the fixture was made on another machine, whose kernels sum in another order, so it gets the
    # fixture README's documented tolerance (as in test_acestep_parity.py).
    velocity = _velocity(reloaded, data)
    assert torch.equal(velocity, _velocity(official, data))
    assert torch.allclose(velocity, data["out.velocity"], atol=1e-4, rtol=1e-4)
    timbre = reloaded.condition_encoder.timbre_encoder
    assert getattr(timbre, "prepends_special_token", False)  # XL token survives the round trip

    save_official(reloaded, tmp_path / "official")
    before = load_file(str(TINY_XL / "model.safetensors"))
    after = load_file(str(tmp_path / "official" / "model.safetensors"))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)
    silence = torch.load(tmp_path / "official" / "silence_latent.pt", weights_only=True)
    assert torch.equal(silence, torch.load(TINY_XL / "silence_latent.pt", weights_only=True))


def test_flash_window_rule_is_not_written_to_disk(tmp_path: Path) -> None:
    models = load_acestep_dit(TINY, "cpu", window_rule="flash")
    assert models.transformer.config.sliding_window == 7
    assert models.condition_encoder.lyric_encoder.sliding_window == 7
    save_diffusers(models, tmp_path)
    saved = json.loads((tmp_path / "transformer" / "config.json").read_text())
    assert saved["sliding_window"] == 8
    with pytest.raises(ValueError, match="window_rule"):
        load_acestep_dit(TINY, "cpu", window_rule="banded")


def test_bfloat16_load_keeps_fsq_in_float32() -> None:
    models = load_acestep_dit(TINY, "cpu", dtype="bf16")
    assert models.dtype == torch.bfloat16
    data = load_file(str(FIXTURES / "acestep15-tiny" / "reference" / "tok_b2_t25.safetensors"))
    result = ops.tokenize(models, data["in.latents"].bfloat16())
    assert result.indices.dtype == torch.int32
    assert result.quantized.dtype == torch.bfloat16
    # bf16 noise can move a code across a rounding boundary: each of a code's 6 FSQ dims lands
    # within bf16 error of a level boundary now and then, and which ones flip depends on the
    # CPU's bf16 kernels. With 10 codes, 0.8 (3 flips fail) is within reach of that noise;
    # 6 flips are not, while a broken path agrees only by chance (~0).
    agree = (result.indices == data["out.indices"]).float().mean()
    assert agree >= 0.5


# --------------------------------------------------------------------------- tiny checkpoints


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_tiny_dit_writes_small_deterministic_loadable_folders(tmp_path: Path, variant: str) -> None:
    first = write_tiny_dit(tmp_path / "a", variant, seed=7)
    second = write_tiny_dit(tmp_path / "b", variant, seed=7)
    other = write_tiny_dit(tmp_path / "c", variant, seed=8)
    for name in ("config.json", "model.safetensors", "silence_latent.pt"):
        assert (first / name).stat().st_size < 3 * 1024 * 1024
        digest = hashlib.sha256((first / name).read_bytes()).hexdigest()
        assert digest == hashlib.sha256((second / name).read_bytes()).hexdigest()
    model_bytes = (first / "model.safetensors").read_bytes()
    assert model_bytes != (other / "model.safetensors").read_bytes()

    models = load_acestep_dit(first, "cpu", expect_variant=variant)
    context = ops.text2music_context(models, batch=2, frames=27)
    conditions = torch.randn(
        2,
        5,
        models.condition_encoder.config.hidden_size,
        generator=torch.Generator().manual_seed(0),
    )
    runs = [ops.turbo_generate(models, conditions, context, seed=[1, 2]).latents for _ in range(2)]
    assert runs[0].shape == (2, 27, 64)
    assert torch.equal(runs[0], runs[1])
    assert torch.isfinite(runs[0]).all() and runs[0].std() > 0.1  # O(1) noise-born latents


def test_codes_to_latents_pads_with_silence_and_checks_range() -> None:
    models = load_acestep_dit(TINY, "cpu")
    codes = torch.tensor([[0, 63999, 12345]])
    latents = ops.codes_to_latents(models, codes, num_frames=20)
    assert latents.shape == (1, 20, 64)
    assert torch.equal(latents[:, 15:], models.silence_latent[:, 15:20])
    assert ops.codes_to_latents(models, codes, num_frames=12).shape == (1, 12, 64)
    with pytest.raises(ValueError, match=r"\[0, 64000\)"):
        ops.codes_to_latents(models, torch.tensor([[64000]]))


# --------------------------------------------------------------------------- micro-batches


def _padded_batch(models, generator: torch.Generator):
    """Two samples (T 40 and 27 frames, L 13 and 8 tokens), right-padded into one batch."""
    width = models.condition_encoder.config.hidden_size
    lengths, tokens = (40, 27), (13, 8)
    x = torch.randn(2, 40, 64, generator=generator)
    context = torch.randn(2, 40, 128, generator=generator)
    conditions = torch.randn(2, 13, width, generator=generator)
    frame_mask = torch.arange(40)[None, :] < torch.tensor(lengths)[:, None]
    token_mask = torch.arange(13)[None, :] < torch.tensor(tokens)[:, None]
    # Padding is zeros, as a collate function writes it (an odd T's last patch needs the zero).
    x, context = x * frame_mask[..., None], context * frame_mask[..., None]
    return x, context, conditions, frame_mask, token_mask, lengths, tokens


def test_padded_keys_match_unpadded_samples_through_checkpointed_backward() -> None:
    models = load_acestep_dit(TINY, "cpu")
    transformer = models.transformer
    x, context, conditions, frame_mask, token_mask, lengths, tokens = _padded_batch(
        models, torch.Generator().manual_seed(0)
    )
    t = torch.tensor([0.7, 0.3])
    weight = transformer.layers[0].self_attn.to_q.weight
    weight.requires_grad_(True)
    transformer.enable_gradient_checkpointing()
    try:
        per_sample_grad = torch.zeros_like(weight)
        singles = []
        for row in range(2):
            models.key_masks.clear()
            v = transformer(
                hidden_states=x[row : row + 1, : lengths[row]],
                timestep=t[row : row + 1],
                timestep_r=t[row : row + 1],
                encoder_hidden_states=conditions[row : row + 1, : tokens[row]],
                context_latents=context[row : row + 1, : lengths[row]],
                return_dict=False,
            )[0]
            (grad,) = torch.autograd.grad(v.square().sum(), weight)
            per_sample_grad += grad
            singles.append(v.detach())

        def padded_forward():
            return transformer(
                hidden_states=x,
                timestep=t,
                timestep_r=t,
                encoder_hidden_states=conditions,
                context_latents=context,
                return_dict=False,
            )[0]

        models.key_masks.clear()
        unmasked = padded_forward()
        models.key_masks.set(ops.patch_key_mask(frame_mask, 2), token_mask)
        masked = padded_forward()
        valid = frame_mask[..., None].float()
        (batch_grad,) = torch.autograd.grad((masked.square() * valid).sum(), weight)
        # Checkpointed blocks re-run in backward and read the masks then: clearing them between
        # forward and backward recomputes a different graph (why the masks stay set).
        early_clear = padded_forward()
        models.key_masks.clear()
        with pytest.raises(torch.utils.checkpoint.CheckpointError):
            torch.autograd.grad((early_clear.square() * valid).sum(), weight)
    finally:
        models.key_masks.clear()
        transformer.disable_gradient_checkpointing()
        weight.requires_grad_(False)
    # Same process and kernels, other shapes (padded batch vs one sample): float32 summation
    # order only. The fixtures' in-machine spread for such changes is <= 3e-6 on outputs of
    # this size (<= 6); atol 2e-5 (+ the default rtol 1e-5) leaves several times that.
    for row in range(2):
        assert torch.allclose(masked[row, : lengths[row]].detach(), singles[row][0], atol=2e-5)
    # A weight gradient sums over every token and both samples: its round-off scales with the
    # gradient's largest entries, not with each entry, so atol is relative to that scale
    # (1e-5, ~80 float32 eps); a padding leak moves it by far more.
    grad_scale = float(per_sample_grad.abs().max())
    assert torch.allclose(batch_grad, per_sample_grad, rtol=1e-4, atol=1e-5 * grad_scale)
    # Without the masks the short sample sees its padding: a large, visible error.
    assert (unmasked[1, : lengths[1]].detach() - singles[1][0]).abs().max() > 0.05


def test_masked_training_loss_ignores_padded_frames() -> None:
    models = load_acestep_dit(TINY, "cpu")
    x, context, conditions, frame_mask, token_mask, _, _ = _padded_batch(
        models, torch.Generator().manual_seed(1)
    )
    losses = []
    for fill in (0.0, 5.0):
        padded = torch.where(frame_mask[..., None], x, torch.full_like(x, fill))  # garbage pad
        batch = ops.TrainBatch(padded, conditions, context, frame_mask, token_mask)
        losses.append(ops.training_forward(models, batch, cfg_ratio=0.0, seed=3).loss)
    # The fill reaches only masked terms, so the two losses agree to float32 round-off of the
    # same computation in this process (1e-6 ~ 8 eps); a leak moves the loss by far more.
    assert torch.allclose(losses[0], losses[1], rtol=1e-6)
    unmasked = ops.training_forward(models, ops.TrainBatch(x, conditions, context), seed=3)
    assert not torch.allclose(unmasked.loss, losses[0])
    assert not models.key_masks.active  # an unmasked batch clears the previous masks
